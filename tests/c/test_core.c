/* Core: tensor views, validation errors, contexts and dispatch, thread-count independence. */
#include "core/tensor_check.h"
#include "dsv4.h"
#include "test_util.h"

#include <stddef.h>

static void test_views(void)
{
    float buf[2 * 3 * 4];
    dsv4_tensor t, v, w;
    int64_t shape[3] = {2, 3, 4};
    CHECK_STATUS(dsv4_tensor_init(&t, buf, DSV4_F32, 3, shape), DSV4_OK);
    CHECK(dsv4_tensor_is_contiguous(&t), "fresh tensor not contiguous");
    CHECK(t.stride[0] == 12 && t.stride[1] == 4 && t.stride[2] == 1, "strides");
    CHECK_STATUS(dsv4_tensor_transpose(&t, 1, 2, &v), DSV4_OK);
    CHECK(v.shape[1] == 4 && v.shape[2] == 3 && v.stride[1] == 1 && v.stride[2] == 4, "transpose");
    CHECK(!dsv4_tensor_is_contiguous(&v), "transposed view claims contiguity");
    CHECK(v.data == buf, "transpose moved data");
    int64_t flat[1] = {24};
    CHECK_STATUS(dsv4_tensor_reshape(&v, 1, flat, &w), DSV4_ERR_STRIDE);
    CHECK_STATUS(dsv4_tensor_reshape(&t, 1, flat, &w), DSV4_OK);
    CHECK(w.shape[0] == 24 && w.stride[0] == 1, "reshape");
    int64_t bad[2] = {5, 5};
    CHECK_STATUS(dsv4_tensor_reshape(&t, 2, bad, &w), DSV4_ERR_SHAPE);
    CHECK_STATUS(dsv4_tensor_slice(&t, 1, 1, 3, &w), DSV4_OK);
    CHECK(w.data == buf + 4 && w.shape[1] == 2, "slice offset");
    CHECK_STATUS(dsv4_tensor_slice(&t, 1, 2, 4, &w), DSV4_ERR_RANGE);
    CHECK_STATUS(dsv4_tensor_slice(&t, 5, 0, 1, &w), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(dsv4_tensor_init(&t, buf, (dsv4_dtype)99, 3, shape), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(dsv4_tensor_init(&t, buf, DSV4_F32, 6, shape), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(dsv4_tensor_init(NULL, buf, DSV4_F32, 3, shape), DSV4_ERR_INVALID_ARG);
    CHECK(dsv4_dtype_size(DSV4_BF16) == 2 && dsv4_dtype_size(DSV4_I64) == 8, "dtype sizes");
}

/* Output views whose elements share memory are refused (threads would race on them). */
static void test_output_views(void)
{
    float buf[64];
    dsv4_tensor t;
    int64_t shape[2] = {4, 4};
    int64_t ok1[2] = {4, 1}, ok2[2] = {1, 4}, ok3[2] = {16, 2}, bad1[2] = {0, 1}, bad2[2] = {2, 1}, bad3[2] = {1, 3};
    dsv4_tensor_init_strided(&t, buf, DSV4_F32, 2, shape, ok1);
    CHECK_STATUS(dsv4_check_output("op", "y", &t), DSV4_OK);
    dsv4_tensor_init_strided(&t, buf, DSV4_F32, 2, shape, ok2); /* transposed */
    CHECK_STATUS(dsv4_check_output("op", "y", &t), DSV4_OK);
    dsv4_tensor_init_strided(&t, buf, DSV4_F32, 2, shape, ok3); /* gaps are fine */
    CHECK_STATUS(dsv4_check_output("op", "y", &t), DSV4_OK);
    dsv4_tensor_init_strided(&t, buf, DSV4_F32, 2, shape, bad1); /* broadcast rows */
    CHECK_STATUS(dsv4_check_output("op", "y", &t), DSV4_ERR_STRIDE);
    dsv4_tensor_init_strided(&t, buf, DSV4_F32, 2, shape, bad2); /* rows overlap */
    CHECK_STATUS(dsv4_check_output("op", "y", &t), DSV4_ERR_STRIDE);
    dsv4_tensor_init_strided(&t, buf, DSV4_F32, 2, shape, bad3); /* interleaved */
    CHECK_STATUS(dsv4_check_output("op", "y", &t), DSV4_ERR_STRIDE);
    int64_t one[2] = {1, 4}, zs[2] = {0, 1};
    dsv4_tensor_init_strided(&t, buf, DSV4_F32, 2, one, zs); /* zero stride on a dim of size 1 */
    CHECK_STATUS(dsv4_check_output("op", "y", &t), DSV4_OK);
    /* through an op: dequantize into rows that alias each other */
    uint8_t codes[4 * 64] = {0}, scales[4] = {127, 127, 127, 127};
    int64_t cs[2] = {4, 64}, ss[2] = {4, 1}, xst[2] = {0, 1};
    dsv4_tensor tc, ts, tx;
    dsv4_tensor_init(&tc, codes, DSV4_U8, 2, cs);
    dsv4_tensor_init(&ts, scales, DSV4_U8, 2, ss);
    dsv4_tensor_init_strided(&tx, buf, DSV4_F32, 2, cs, xst);
    buf[0] = 42.0f;
    CHECK_STATUS(dsv4_dequantize(NULL, DSV4_QRULE_KV64, &tc, &ts, &tx), DSV4_ERR_STRIDE);
    CHECK(buf[0] == 42.0f, "refused output written");
}

static void test_contexts(void)
{
    CHECK(dsv4_backend_count() >= 2, "cpu and cpu-ref registered");
    CHECK(!strcmp(dsv4_backend_name(0), "cpu"), "first backend is cpu");
    CHECK(dsv4_backend_name(-1) == NULL && dsv4_backend_name(99) == NULL, "out-of-range backend index");
    dsv4_ctx *c = NULL;
    dsv4_ctx_options o = {.backend = "no-such-backend", .threads = 0};
    CHECK_STATUS(dsv4_ctx_create(&o, &c), DSV4_ERR_NOT_FOUND);
    CHECK(c == NULL, "failed create wrote its output");
    o.backend = "cpu-ref";
    o.threads = -3;
    CHECK_STATUS(dsv4_ctx_create(&o, &c), DSV4_ERR_INVALID_ARG);
    o.threads = 1;
    CHECK_STATUS(dsv4_ctx_create(&o, &c), DSV4_OK);
    CHECK(c && !strcmp(dsv4_ctx_backend_name(c), "cpu-ref") && dsv4_ctx_threads(c) == 1, "ctx fields");
    dsv4_ctx_destroy(c);
    CHECK_STATUS(dsv4_ctx_create(NULL, NULL), DSV4_ERR_INVALID_ARG);
    CHECK(dsv4_ctx_backend_name(NULL) != NULL, "default context resolves");
}

/* The kernel choices are options read when a context is created: the ISA cap (option, else
 * $DSV4_CPU_ISA), a clear error for an unknown name, a warning and no cap for an unknown
 * environment value, and a context keeps its choice when the environment changes later. */
static void test_context_options(void)
{
    dsv4_ctx *c = NULL;
    dsv4_ctx_options o = {.backend = "cpu", .threads = 1, .cpu_isa = "avx3"};
    CHECK_STATUS(dsv4_ctx_create(&o, &c), DSV4_ERR_INVALID_ARG);
    CHECK(c == NULL && strstr(dsv4_last_error(), "avx3") && strstr(dsv4_last_error(), "scalar"), "message: %s",
          dsv4_last_error());
    o.cpu_isa = "scalar";
    CHECK_STATUS(dsv4_ctx_create(&o, &c), DSV4_OK);
    CHECK(c && !strcmp(dsv4_ctx_cpu_isa(c), "scalar"), "capped at scalar: %s", c ? dsv4_ctx_cpu_isa(c) : "-");
    dsv4_ctx_destroy(c);
    char best[32];
    snprintf(best, sizeof best, "%s", dsv4_cpu_isa());
    o.cpu_isa = "avx512"; /* a cap only: the best present at most */
    CHECK_STATUS(dsv4_ctx_create(&o, &c), DSV4_OK);
    CHECK(c && !strcmp(dsv4_ctx_cpu_isa(c), best), "avx512 cap: %s, best %s", c ? dsv4_ctx_cpu_isa(c) : "-", best);
    dsv4_ctx_destroy(c);

    o.cpu_isa = NULL;
    setenv("DSV4_CPU_ISA", "scalar", 1);
    CHECK_STATUS(dsv4_ctx_create(&o, &c), DSV4_OK);
    CHECK(!strcmp(dsv4_cpu_isa(), "scalar"), "dsv4_cpu_isa follows $DSV4_CPU_ISA: %s", dsv4_cpu_isa());
    setenv("DSV4_CPU_ISA", "avx2", 1); /* read at creation only */
    CHECK(c && !strcmp(dsv4_ctx_cpu_isa(c), "scalar"), "env default: %s", c ? dsv4_ctx_cpu_isa(c) : "-");
    dsv4_ctx_destroy(c);
    setenv("DSV4_CPU_ISA", "bogus", 1); /* a warning on stderr, then no cap */
    CHECK_STATUS(dsv4_ctx_create(&o, &c), DSV4_OK);
    CHECK(c && !strcmp(dsv4_ctx_cpu_isa(c), best), "bad env value: %s", c ? dsv4_ctx_cpu_isa(c) : "-");
    dsv4_ctx_destroy(c);
    unsetenv("DSV4_CPU_ISA");
    /* options another backend reads are not checked here: cpu ignores cuda_decode */
    o.cuda_decode = "ws2";
    CHECK_STATUS(dsv4_ctx_create(&o, &c), DSV4_OK);
    dsv4_ctx_destroy(c);
}

/* Thread counts: an option above DSV4_MAX_THREADS is refused (10^9 threads once planned 68 GiB
 * of per-thread buffers); a $DSV4_THREADS that is not a count in [1, DSV4_MAX_THREADS] is ignored
 * with a warning naming it. */
static void test_thread_counts(void)
{
    dsv4_ctx *c = NULL;
    dsv4_ctx_options o = {.backend = "cpu", .threads = DSV4_MAX_THREADS + 1};
    CHECK_STATUS(dsv4_ctx_create(&o, &c), DSV4_ERR_INVALID_ARG);
    CHECK(!c && strstr(dsv4_last_error(), "1024") && strstr(dsv4_last_error(), "1025"), "%s", dsv4_last_error());
    o.threads = 1000000000;
    CHECK_STATUS(dsv4_ctx_create(&o, &c), DSV4_ERR_INVALID_ARG);
    o.threads = DSV4_MAX_THREADS;
    CHECK_STATUS(dsv4_ctx_create(&o, &c), DSV4_OK);
    CHECK(dsv4_ctx_threads(c) == DSV4_MAX_THREADS, "threads %d", dsv4_ctx_threads(c));
    dsv4_ctx_destroy(c);
    unsetenv("DSV4_THREADS");
    const int all = dsv4_default_threads();
    dsv4_set_warning_handler(test_on_warning, NULL);
    const char *bad[] = {"1000000000", "0", "-3", "4x", " 2", "+2", "1025", "99999999999999999999"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        test_caught()->n = 0;
        setenv("DSV4_THREADS", bad[k], 1);
        int n = dsv4_default_threads();
        CHECK(n == all && test_caught()->n == 1 && strstr(test_caught()->last, "DSV4_THREADS") && strstr(test_caught()->last, bad[k]),
              "DSV4_THREADS='%s': %d threads (all %d), %d warnings: %s", bad[k], n, all, test_caught()->n, test_caught()->last);
    }
    test_caught()->n = 0;
    setenv("DSV4_THREADS", "3", 1);
    CHECK(dsv4_default_threads() == 3 && test_caught()->n == 0, "DSV4_THREADS=3");
    unsetenv("DSV4_THREADS");
    dsv4_set_warning_handler(dsv4_warning_stderr, NULL);
}

/* The struct layout table bindings check themselves against (src/core/abi.c). */
static void test_abi_layout(void)
{
    size_t size = 0, off = 0, fsize = 0;
    int n = 0;
    const char *name = NULL;
    CHECK_STATUS(dsv4_abi_struct("dsv4_tensor", &size, &n), DSV4_OK);
    CHECK(size == sizeof(dsv4_tensor) && n == 7, "dsv4_tensor: %zu bytes, %d fields", size, n);
    CHECK_STATUS(dsv4_abi_field("dsv4_tensor", 3, &name, &off, &fsize), DSV4_OK);
    CHECK(!strcmp(name, "shape") && off == offsetof(dsv4_tensor, shape) && fsize == sizeof(int64_t) * DSV4_MAX_DIMS,
          "dsv4_tensor field 3: %s at %zu, %zu bytes", name, off, fsize);
    CHECK_STATUS(dsv4_abi_struct("dsv4_ctx_options", &size, &n), DSV4_OK);
    CHECK(size == sizeof(dsv4_ctx_options) && n == 5, "dsv4_ctx_options: %zu bytes, %d fields", size, n);
    CHECK_STATUS(dsv4_abi_field("dsv4_tensor", 7, &name, &off, &fsize), DSV4_ERR_RANGE);
    CHECK_STATUS(dsv4_abi_field("dsv4_tensor", -1, &name, &off, &fsize), DSV4_ERR_RANGE);
    CHECK_STATUS(dsv4_abi_struct("dsv4_nothing", &size, &n), DSV4_ERR_NOT_FOUND);
    CHECK_STATUS(dsv4_abi_struct(NULL, &size, &n), DSV4_ERR_INVALID_ARG);
}

/* Bad input to an op: an error status and message, and the outputs untouched. */
static void test_bad_input(void)
{
    enum { R = 3, K = 128 };
    float x[R * K];
    uint8_t codes[R * K], scales[R * 4];
    for (int i = 0; i < R * K; i++) x[i] = test_randn();
    memset(codes, 0xA5, sizeof codes);
    memset(scales, 0x5A, sizeof scales);
    dsv4_tensor tx, tc, ts;
    int64_t xs[2] = {R, K}, ss[2] = {R, K / 64};
    dsv4_tensor_init(&tx, x, DSV4_F32, 2, xs);
    dsv4_tensor_init(&tc, codes, DSV4_U8, 2, xs);
    dsv4_tensor_init(&ts, scales, DSV4_U8, 2, ss);
    CHECK_STATUS(dsv4_quantize(NULL, DSV4_QRULE_KV64, NULL, &tc, &ts), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(dsv4_quantize(NULL, (dsv4_qrule)7, &tx, &tc, &ts), DSV4_ERR_INVALID_ARG);
    dsv4_tensor wrong = tx;
    wrong.dtype = DSV4_BF16;
    CHECK_STATUS(dsv4_quantize(NULL, DSV4_QRULE_KV64, &wrong, &tc, &ts), DSV4_ERR_DTYPE);
    wrong = tx;
    wrong.stride[1] = 2;
    wrong.shape[1] = 64;
    CHECK_STATUS(dsv4_quantize(NULL, DSV4_QRULE_KV64, &wrong, &tc, &ts), DSV4_ERR_SHAPE);
    wrong = tx;
    wrong.stride[1] = 2;
    dsv4_tensor tc2 = tc, ts2 = ts;
    CHECK_STATUS(dsv4_quantize(NULL, DSV4_QRULE_KV64, &wrong, &tc2, &ts2), DSV4_ERR_STRIDE);
    wrong = tx;
    wrong.shape[1] = 100;
    CHECK_STATUS(dsv4_quantize(NULL, DSV4_QRULE_KV64, &wrong, &tc, &ts), DSV4_ERR_SHAPE);
    ts2.shape[1] = 3;
    CHECK_STATUS(dsv4_quantize(NULL, DSV4_QRULE_KV64, &tx, &tc, &ts2), DSV4_ERR_SHAPE);
    tc2 = tc;
    tc2.data = NULL;
    CHECK_STATUS(dsv4_quantize(NULL, DSV4_QRULE_KV64, &tx, &tc2, &ts), DSV4_ERR_INVALID_ARG);
    tc2 = tc;
    tc2.dtype = DSV4_F8_E4M3;
    dsv4_tensor ts4;
    int64_t s4[2] = {R, K / 32};
    dsv4_tensor_init(&ts4, scales, DSV4_U8, 2, s4);
    CHECK_STATUS(dsv4_quantize(NULL, DSV4_QRULE_FP4_32, &tx, &tc2, &ts4), DSV4_ERR_DTYPE);
    /* output overlapping the input */
    dsv4_tensor alias = tc;
    alias.data = x;
    CHECK_STATUS(dsv4_quantize(NULL, DSV4_QRULE_KV64, &tx, &alias, &ts), DSV4_ERR_INVALID_ARG);
    int untouched = 1;
    for (int i = 0; i < R * K; i++) untouched &= codes[i] == 0xA5;
    for (int i = 0; i < R * 4; i++) untouched &= scales[i] == 0x5A;
    CHECK(untouched, "outputs written by a failing call");
    CHECK_STATUS(dsv4_encode_array(NULL, DSV4_FMT_E8M0, x, 4, codes), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(dsv4_encode_array(NULL, DSV4_FMT_E4M3, NULL, 4, codes), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(dsv4_encode_array(NULL, DSV4_FMT_E4M3, x, -1, codes), DSV4_ERR_INVALID_ARG);
    uint8_t odd[3] = {1, 2, 3}, packed[2] = {0, 0};
    CHECK_STATUS(dsv4_fp4_pack(odd, 3, packed), DSV4_ERR_INVALID_ARG);
    uint8_t big[2] = {1, 16};
    CHECK_STATUS(dsv4_fp4_pack(big, 2, packed), DSV4_ERR_RANGE);
    CHECK(packed[0] == 0, "fp4_pack wrote on error");
    CHECK_STATUS(dsv4_dequantize_weight(NULL, &tc, &ts, &tx), DSV4_ERR_DTYPE);
}

/* 1-thread and 2-thread runs are bit-identical, for every rule and both cpu backends. */
static void test_thread_independence(void)
{
    enum { R = 97, K = 1024 };
    float *x = malloc(sizeof(float) * R * K);
    uint8_t *c1 = malloc(R * K), *c2 = malloc(R * K), s1[R * 32], s2[R * 32];
    for (int i = 0; i < R * K; i++) x[i] = test_randn() * ldexpf(1.0f, (int)(test_rand_u64() % 30) - 15);
    const char *backs[2] = {"cpu", "cpu-ref"};
    for (int b = 0; b < 2; b++) {
        dsv4_ctx *one, *two;
        dsv4_ctx_options o1 = {.backend = backs[b], .threads = 1}, o2 = {.backend = backs[b], .threads = 2};
        dsv4_ctx_create(&o1, &one);
        dsv4_ctx_create(&o2, &two);
        for (int r = 0; r < DSV4_QRULE_COUNT; r++) {
            int64_t g = dsv4_qrule_group((dsv4_qrule)r), xs[2] = {R, K}, ss[2] = {R, K / g};
            dsv4_tensor tx, ta, tb, sa, sb;
            dsv4_tensor_init(&tx, x, DSV4_F32, 2, xs);
            dsv4_tensor_init(&ta, c1, DSV4_U8, 2, xs);
            dsv4_tensor_init(&tb, c2, DSV4_U8, 2, xs);
            dsv4_tensor_init(&sa, s1, DSV4_U8, 2, ss);
            dsv4_tensor_init(&sb, s2, DSV4_U8, 2, ss);
            CHECK_STATUS(dsv4_quantize(one, (dsv4_qrule)r, &tx, &ta, &sa), DSV4_OK);
            CHECK_STATUS(dsv4_quantize(two, (dsv4_qrule)r, &tx, &tb, &sb), DSV4_OK);
            CHECK(!memcmp(c1, c2, R * K) && !memcmp(s1, s2, (size_t)(R * K / g)), "%s rule %d differs 1 vs 2 threads",
                  backs[b], r);
        }
        dsv4_ctx_destroy(one);
        dsv4_ctx_destroy(two);
    }
    free(x);
    free(c1);
    free(c2);
}

int main(void)
{
    test_seed();
    test_views();
    test_output_views();
    test_contexts();
    test_context_options();
    test_thread_counts();
    test_abi_layout();
    test_bad_input();
    test_thread_independence();
    TEST_DONE();
}
