/* Minimal test harness for the C tests: CHECK records a failure and goes on; main returns
 * the failure count through TEST_DONE. Each test prints "N passed, M failed". */
#ifndef DSV4_TEST_UTIL_H
#define DSV4_TEST_UTIL_H

#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dsv4.h"

static int test_failures, test_checks;

#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        test_checks++;                                                       \
        if (!(cond)) {                                                       \
            test_failures++;                                                 \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                    \
            fprintf(stderr, "\n");                                           \
        }                                                                    \
    } while (0)

/* Expect a status and a non-empty error message. */
#define CHECK_STATUS(expr, want)                                                              \
    do {                                                                                      \
        dsv4_clear_error();                                                                   \
        dsv4_status got_ = (expr);                                                            \
        CHECK(got_ == (want), "%s returned %d (%s), expected %d", #expr, (int)got_,           \
              dsv4_last_error(), (int)(want));                                                \
        if ((want) != DSV4_OK) CHECK(dsv4_last_error()[0] != 0, "%s: empty error message", #expr); \
    } while (0)

/* Remove a flat folder of files (a checkpoint a test wrote) and the folder. */
static inline void test_rm_dir(const char *d)
{
    DIR *h = opendir(d);
    if (!h) return;
    struct dirent *e;
    while ((e = readdir(h))) {
        if (e->d_name[0] == '.') continue;
        char p[PATH_MAX + 1024];
        snprintf(p, sizeof p, "%s/%s", d, e->d_name);
        unlink(p);
    }
    closedir(h);
    rmdir(d);
}

#define TEST_DONE()                                                                    \
    do {                                                                               \
        printf("%d passed, %d failed\n", test_checks - test_failures, test_failures); \
        return test_failures ? 1 : 0;                                                  \
    } while (0)

/* Deterministic per-run random numbers: seeded from the time unless DSV4_TEST_SEED is set;
 * the seed is printed so a failure can be replayed. */
static uint64_t test_rng_state;
static inline uint64_t test_rand_u64(void)
{
    uint64_t z = (test_rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline void test_seed(void)
{
    const char *s = getenv("DSV4_TEST_SEED");
    test_rng_state = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu (DSV4_TEST_SEED to replay)\n", (unsigned long long)test_rng_state);
}
static inline float test_randn(void)
{
    double u1 = ((double)(test_rand_u64() >> 11) + 1.0) / 9007199254740993.0;
    double u2 = (double)(test_rand_u64() >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* BF16 arrays agree within one BF16 ulp (relative 2^-7) plus 1e-5 of the largest magnitude
 * (orders of fp32 sums differ between the vector kernels and the reference). */
static inline int bf16_close(const uint16_t *a, const uint16_t *b, size_t n)
{
    float big = 0.0f;
    for (size_t i = 0; i < n; i++) big = fmaxf(big, fabsf(dsv4_bf16_decode(b[i])));
    for (size_t i = 0; i < n; i++) {
        float x = dsv4_bf16_decode(a[i]), y = dsv4_bf16_decode(b[i]);
        if (!(fabsf(x - y) <= 0x1p-7f * fabsf(y) + 1e-5f * big)) return 0;
    }
    return 1;
}

static inline int f32_close(const float *a, const float *b, size_t n, float atol)
{
    for (size_t i = 0; i < n; i++)
        if (!(fabsf(a[i] - b[i]) <= atol)) return 0;
    return 1;
}

/* The cpu backend's ISA levels, best first: a context capped at one of them
 * (dsv4_ctx_options.cpu_isa; NULL: no cap) runs that path, or a lower one on a machine without it. */
static const char *const test_isas[3] = {"avx512", "avx2", "scalar"};
static inline dsv4_ctx *test_ctx(const char *backend, int threads, const char *isa)
{
    dsv4_ctx_options o = {.backend = backend, .threads = threads, .cpu_isa = isa};
    dsv4_ctx *c = NULL;
    if (dsv4_ctx_create(&o, &c) != DSV4_OK) {
        fprintf(stderr, "context %s (%d threads, isa %s): %s\n", backend, threads, isa ? isa : "-", dsv4_last_error());
        exit(1);
    }
    return c;
}

/* Whole files, for tests that write hostile variants of a checkpoint: test_read_file returns a
 * malloc'd buffer (NULL if unreadable) with *n bytes and a NUL after them. */
static inline char *test_read_file(const char *p, size_t *n)
{
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 16);
    *n = fread(b, 1, (size_t)len, f);
    b[*n] = 0;
    fclose(f);
    return b;
}

static inline void test_write_file(const char *p, const void *data, size_t n)
{
    FILE *f = fopen(p, "wb");
    if (!f) return;
    fwrite(data, 1, n, f);
    fclose(f);
}

/* Warnings caught by a test (dsv4_set_warning_handler(test_on_warning, NULL)): how many, the last. */
typedef struct test_warnings {
    int n;
    char last[512];
} test_warnings;
static inline test_warnings *test_caught(void)
{
    static test_warnings w;
    return &w;
}
static inline void test_on_warning(void *user, const char *msg)
{
    (void)user;
    test_caught()->n++;
    snprintf(test_caught()->last, sizeof test_caught()->last, "%s", msg);
}

/* The shared test checkpoint hf-tiny-a: $DSV4_SHARED/testdata/hf-tiny-a, else shared/testdata next to
 * the checkout. 1 with its path in `out` when it is a folder; else 0, having said what is skipped. */
static inline int test_find_hf_tiny(char *out, size_t cap)
{
    const char *env = getenv("DSV4_SHARED"), *f = __FILE__, *slash = strrchr(f, '/');
    if (env) snprintf(out, cap, "%s/testdata/hf-tiny-a", env);
    else if (slash) snprintf(out, cap, "%.*s/../../../shared/testdata/hf-tiny-a", (int)(slash - f), f);
    else snprintf(out, cap, "../shared/testdata/hf-tiny-a");
    struct stat sb;
    if (stat(out, &sb) == 0 && S_ISDIR(sb.st_mode)) return 1;
    printf("skipped the hf-tiny-a checks: %s not found (set DSV4_SHARED)\n", out);
    return 0;
}

/* The index of the largest of x[0..n) (the first of equals) and its margin over the next largest. */
static inline int test_argmax(const float *x, int64_t n, float *margin)
{
    int best = 0;
    for (int64_t v = 1; v < n; v++) best = x[v] > x[best] ? (int)v : best;
    float second = -INFINITY;
    for (int64_t v = 0; v < n; v++) second = v != best && x[v] > second ? x[v] : second;
    *margin = x[best] - second;
    return best;
}

#endif
