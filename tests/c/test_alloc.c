/* No allocation in the process's hot path: this test defines malloc, calloc, realloc, free,
 * posix_memalign, aligned_alloc, memalign and valloc itself (the executable's definitions come
 * first in symbol lookup, for every library of the process), forwards them to glibc's own
 * allocator (__libc_malloc and friends) and counts the calls while a window is open. On the
 * tiny model (make-tiny) with 2 threads, after a warm-up, decode steps must make none: plain steps
 * through dsv4_engine_step, MTP steps (k = 2), and a batched step of two sequences. With the
 * former OpenMP threading this counted a few hundred calls per step (the runtime's own work
 * descriptors); the context's pool (src/core/pool.h) allocates only when it is created.
 *
 * Under AddressSanitizer the sanitizer owns malloc, so the test skips (exit 77, reported as
 * skipped by CTest). */
#include "dsv4.h"
#include "dsv4/engine.h"
#include "test_util.h"

#include <dirent.h>
#include <stdatomic.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define ALLOC_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ALLOC_SANITIZED 1
#endif
#endif

#ifndef ALLOC_SANITIZED
static atomic_int window;      /* counting is on */
static atomic_long alloc_calls; /* calls while it was */

static void count(void)
{
    if (atomic_load_explicit(&window, memory_order_relaxed)) atomic_fetch_add(&alloc_calls, 1);
}

/* glibc's allocator under its exported internal names (GLIBC_2.0) */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

void *malloc(size_t n)
{
    count();
    return __libc_malloc(n);
}
void *calloc(size_t n, size_t s)
{
    count();
    return __libc_calloc(n, s);
}
void *realloc(void *p, size_t n)
{
    count();
    return __libc_realloc(p, n);
}
void free(void *p)
{
    if (p) count();
    __libc_free(p);
}
void *memalign(size_t a, size_t n)
{
    count();
    return __libc_memalign(a, n);
}
void *aligned_alloc(size_t a, size_t n)
{
    count();
    return __libc_memalign(a, n);
}
void *valloc(size_t n)
{
    count();
    return __libc_memalign((size_t)sysconf(_SC_PAGESIZE), n);
}
int posix_memalign(void **out, size_t a, size_t n)
{
    count();
    if (a < sizeof(void *) || (a & (a - 1))) return 22; /* EINVAL */
    void *p = __libc_memalign(a, n);
    if (!p && n) return 12; /* ENOMEM */
    *out = p;
    return 0;
}

static void open_window(void)
{
    atomic_store(&alloc_calls, 0);
    atomic_store(&window, 1);
}

static long close_window(void)
{
    atomic_store(&window, 0);
    return atomic_load(&alloc_calls);
}

static char dir[64];

/* One step of every request; the next step feeds each one's last token. */
static dsv4_status step(dsv4_engine *e, dsv4_step_request *rq, int n, int32_t (*tok)[1])
{
    dsv4_status st = dsv4_engine_step(e, rq, n);
    for (int i = 0; i < n && st == DSV4_OK; i++) tok[i][0] = rq[i].out[rq[i].n_out - 1];
    return st;
}

static void run(int threads)
{
    dsv4_ctx *ctx = NULL;
    dsv4_ctx_options co = {.backend = "cpu", .threads = threads};
    dsv4_engine_options eo = {.max_context = 512, .max_seqs = 3, .max_batch = 32, .max_mtp = 2};
    dsv4_engine *e = NULL;
    CHECK(dsv4_ctx_create(&co, &ctx) == DSV4_OK && dsv4_engine_create(ctx, dir, &eo, &e) == DSV4_OK, "engine: %s",
          dsv4_last_error());
    if (!e) {
        dsv4_ctx_destroy(ctx);
        return;
    }
    int seq[2] = {-1, -1};
    CHECK(dsv4_engine_seq_create(e, &seq[0]) == DSV4_OK && dsv4_engine_seq_create(e, &seq[1]) == DSV4_OK, "seqs: %s",
          dsv4_last_error());
    const int64_t V = dsv4_engine_config(e)->vocab_size;
    int32_t prompt[12], tok[2][1], out[2][3];
    uint64_t rng[2][4];
    for (int i = 0; i < 12; i++) prompt[i] = (int32_t)(test_rand_u64() % (uint64_t)V);
    dsv4_step_request rq[2];
    for (int i = 0; i < 2; i++) {
        dsv4_rng_seed(7 + (uint64_t)i, rng[i]);
        rq[i] = (dsv4_step_request){.seq = seq[i], .tokens = prompt, .n_tokens = 12, .mtp = 0, .sample = 1,
                                    .sampling = {.temperature = 0.0f, .top_p = 1.0f}, .rng = rng[i], .out = out[i]};
    }
    /* the prompts, then warm-up steps of each kind (first touches of every buffer and page) */
    CHECK(step(e, rq, 2, tok) == DSV4_OK, "prefill: %s", dsv4_last_error());
    for (int i = 0; i < 2; i++) rq[i].tokens = tok[i], rq[i].n_tokens = 1;
    dsv4_status st = DSV4_OK;
    for (int w = 0; w < 2 && st == DSV4_OK; w++) {
        for (int i = 0; i < 2; i++) rq[i].mtp = w;
        st = step(e, rq, 1, tok);
        if (st == DSV4_OK) st = step(e, rq, 2, tok);
    }
    CHECK(st == DSV4_OK, "warm-up: %s", dsv4_last_error());
    static const struct {
        const char *what;
        int n, mtp;
    } kinds[] = {{"plain step", 1, 0}, {"MTP step (k = 2)", 1, 2}, {"batched step of two sequences", 2, 0},
                 {"batched MTP step of two sequences", 2, 1}};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0] && st == DSV4_OK; k++) {
        for (int i = 0; i < 2; i++) rq[i].mtp = kinds[k].mtp;
        st = step(e, rq, kinds[k].n, tok); /* the first of this kind after the others: untimed */
        open_window();
        for (int s = 0; s < 8 && st == DSV4_OK; s++) st = step(e, rq, kinds[k].n, tok);
        long calls = close_window();
        CHECK(st == DSV4_OK, "%s: %s", kinds[k].what, dsv4_last_error());
        printf("%d threads, %s: %ld allocator calls in 8 steps\n", threads, kinds[k].what, calls);
        CHECK(calls == 0, "%d threads, %s: %ld allocator calls in 8 steps (want 0)", threads, kinds[k].what, calls);
    }
    dsv4_engine_destroy(e);
    dsv4_ctx_destroy(ctx);
}

/* The window itself counts: a malloc and a free inside it are 2 calls. */
static void self_check(void)
{
    open_window();
    void *volatile p = malloc(64);
    free(p);
    long calls = close_window();
    CHECK(calls == 2, "the interposer counted %ld calls of malloc + free (want 2)", calls);
}

int main(void)
{
    test_seed();
    self_check();
    snprintf(dir, sizeof dir, "/tmp/dsv4-alloc-XXXXXX");
    if (!mkdtemp(dir) || dsv4_make_tiny(dir, 1) != DSV4_OK) {
        CHECK(0, "make_tiny: %s", dsv4_last_error());
        TEST_DONE();
    }
    run(2);
    run(3); /* more threads than chunks of some loops: workers that find nothing */
    test_rm_dir(dir);
    TEST_DONE();
}
#else
int main(void)
{
    (void)test_failures, (void)test_checks; /* the harness is not used here */
    printf("skipped: AddressSanitizer replaces the allocator, so calls cannot be counted here\n");
    return 77;
}
#endif
