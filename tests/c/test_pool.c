/* The context's worker pool (src/core/pool.h): every iteration of a loop runs exactly once for
 * any thread count, loop size and grain; team loops give distinct worker numbers below the thread
 * count to the threads running at once; a loop nested in a chunk runs on that chunk's thread; two
 * application threads sharing a context both complete; thousands of back-to-back loops (late
 * workers against the generation check); a forked child without workers still completes; a worker
 * that holds its chunk far longer than the caller's took but sleeps is no competition (the team
 * stays whole where the kernel's run-queue times say so); a forced competitor (the pool's threads
 * on one core) shrinks the team to the caller alone, and a probe uses the worker again after. */
#define _GNU_SOURCE /* sched_setaffinity */
#include "core/pool.h"
#include "test_util.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXN 100003

static atomic_int hits[MAXN];

static void count_fn(void *arg, int64_t lo, int64_t hi)
{
    (void)arg;
    for (int64_t i = lo; i < hi; i++) atomic_fetch_add(&hits[i], 1);
}

/* every hits[i] == want for i < n, 0 beyond (up to n + 8) */
static int hits_are(int64_t n, int want)
{
    for (int64_t i = 0; i < n && i < MAXN; i++)
        if (atomic_load(&hits[i]) != want) return 0;
    for (int64_t i = n; i < n + 8 && i < MAXN; i++)
        if (atomic_load(&hits[i]) != 0) return 0;
    return 1;
}

static void clear_hits(void)
{
    for (int i = 0; i < MAXN; i++) atomic_store(&hits[i], 0);
}

static dsv4_ctx *make(int threads, dsv4_exec *ex)
{
    dsv4_ctx *c = NULL;
    dsv4_ctx_options o = {.backend = "cpu", .threads = threads};
    const dsv4_backend *b;
    if (dsv4_ctx_create(&o, &c) != DSV4_OK || dsv4_ctx_resolve(c, &b, ex) != DSV4_OK) {
        CHECK(0, "context of %d threads: %s", threads, dsv4_last_error());
        dsv4_ctx_destroy(c);
        return NULL;
    }
    return c;
}

/* team loop: worker numbers in range and not shared by two threads at once; chunks once each */
typedef struct {
    int threads;
    atomic_int in_use[64];
    atomic_int bad;
} team_state;

static void team_fn(void *arg, dsv4_par_loop *l, int worker)
{
    team_state *s = arg;
    if (worker < 0 || worker >= s->threads || atomic_exchange(&s->in_use[worker], 1)) {
        atomic_store(&s->bad, 1);
        return; /* the loop then cannot finish its chunks: the counts show it too */
    }
    int64_t lo, hi;
    while (dsv4_par_next(l, &lo, &hi)) count_fn(NULL, lo, hi);
    atomic_store(&s->in_use[worker], 0);
}

/* nested: each outer iteration runs an inner loop of 16 on the same pool, on its own thread */
typedef struct {
    const dsv4_exec *ex;
    atomic_int wrong_thread;
} nest_state;

typedef struct {
    pthread_t outer;
    atomic_int *wrong;
    int64_t base;
} inner_arg;

static void inner_fn(void *arg, int64_t lo, int64_t hi)
{
    inner_arg *a = arg;
    if (!pthread_equal(a->outer, pthread_self())) atomic_store(a->wrong, 1);
    for (int64_t i = lo; i < hi; i++) atomic_fetch_add(&hits[a->base + i], 1);
}

static void outer_fn(void *arg, int64_t lo, int64_t hi)
{
    nest_state *s = arg;
    for (int64_t i = lo; i < hi; i++) {
        inner_arg a = {pthread_self(), &s->wrong_thread, i * 16};
        dsv4_par_for(s->ex, 16, 1, inner_fn, &a);
    }
}

typedef struct {
    const dsv4_exec *ex;
    int64_t base;
} share_arg;

static void share_fn(void *arg, int64_t lo, int64_t hi)
{
    share_arg *a = arg;
    for (int64_t i = lo; i < hi; i++) atomic_fetch_add(&hits[a->base + i], 1);
}

static void *share_thread(void *v)
{
    share_arg *a = v;
    for (int r = 0; r < 300; r++) dsv4_par_for(a->ex, 1000, 7, share_fn, a);
    return NULL;
}

/* The stall: worker 1 sits on its chunk for 50 ms while the caller, its own chunk done, waits. */
typedef struct {
    atomic_int other_started, other_ran, calls, bad;
    int64_t n;
} stall_state;

static void sleep_us(long us)
{
    struct timespec t = {us / 1000000, us % 1000000 * 1000};
    nanosleep(&t, NULL);
}

static void stall_fn(void *arg, dsv4_par_loop *l, int worker)
{
    stall_state *s = arg;
    int64_t lo, hi;
    while (dsv4_par_next(l, &lo, &hi)) {
        if (worker) {
            atomic_store(&s->other_started, 1);
            sleep_us(50000);
        } else { /* hold chunk 0 until a worker has the other one (bounded: about 2 s) */
            for (int i = 0; i < 200000 && !atomic_load(&s->other_started); i++) sleep_us(10);
        }
    }
}

static void watch_fn(void *arg, dsv4_par_loop *l, int worker)
{
    stall_state *s = arg;
    int64_t lo, hi;
    while (dsv4_par_next(l, &lo, &hi)) {
        atomic_fetch_add(&s->calls, 1);
        if (worker) atomic_store(&s->other_ran, 1);
        else if (lo != 0 || hi != s->n) atomic_store(&s->bad, 1); /* not the whole loop at once */
    }
}

static int schedstat_readable(void)
{
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    long long run = -1, queued = -1;
    int ok = f && fscanf(f, "%lld %lld", &run, &queued) == 2 && queued >= 0;
    if (f) fclose(f);
    return ok;
}

/* A worker that holds its chunk but sleeps (no other process has its core): where the kernel's
 * run-queue times are readable that is no competition and the team stays whole; where they are
 * not, the stall alone is the sign and the next loop runs on the caller alone. */
static void test_stall(void)
{
    const int readable = schedstat_readable();
    /* the caller's chunk lasts until the worker has started, so a worker slow to wake (a loaded
     * machine) can make the 50 ms look short next to it, and on a loaded machine the worker can
     * really wait for a core after its sleep: a few tries, each on a new context */
    int calls = 0, solo = 0, whole = 0;
    int64_t k[DSV4_POOL_COUNTS] = {0};
    for (int attempt = 0; attempt < 5 && !(readable ? whole : solo); attempt++) {
        dsv4_exec ex;
        dsv4_ctx *c = make(2, &ex);
        if (!c) return;
        for (int w = 0; w < 2; w++) { /* the first stall opens the window, the second judges it */
            stall_state st = {.n = 2};
            dsv4_par_team(&ex, 2, 1, stall_fn, &st);
        }
        stall_state w = {.n = 64};
        dsv4_par_team(&ex, 64, 1, watch_fn, &w);
        calls = atomic_load(&w.calls);
        solo = calls == 1 && !atomic_load(&w.bad) && !atomic_load(&w.other_ran);
        dsv4_pool_counts(ex.pool, k);
        whole = k[DSV4_POOL_STALLS] == 2 && !solo && k[DSV4_POOL_SHRINKS] == 0 && k[DSV4_POOL_TEAM] == 2;
        dsv4_ctx_destroy(c);
    }
    if (readable)
        CHECK(whole, "a sleeping worker is no competition: the team stays whole (%lld stalls, %lld shrinks, team %lld)",
              (long long)k[DSV4_POOL_STALLS], (long long)k[DSV4_POOL_SHRINKS], (long long)k[DSV4_POOL_TEAM]);
    else
        CHECK(solo, "after a stall (no run-queue times here) the next loop runs whole on the caller (%d chunk calls)", calls);
}

/* about us microseconds of work */
static void work_fn(void *arg, int64_t lo, int64_t hi)
{
    (void)arg;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000000L + t.tv_nsec - t0.tv_nsec < (hi - lo) * 5000L);
}

static double ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

/* A forced competitor: the pool's threads on one core, so each waits on the run queue while
 * another runs. The team must shrink to the caller alone, and a probe must later give the
 * worker loops again (that it then stays depends on the machine's load, so it is not checked). */
static void test_competitor(int threads)
{
    if (!schedstat_readable()) {
        printf("# no run-queue times in /proc here: the forced competitor is not tested\n");
        return;
    }
    cpu_set_t all, one;
    if (sched_getaffinity(0, sizeof all, &all) != 0) return;
    CPU_ZERO(&one);
    for (int i = 0; i < CPU_SETSIZE; i++)
        if (CPU_ISSET(i, &all)) {
            CPU_SET(i, &one);
            break;
        }
    CHECK(sched_setaffinity(0, sizeof one, &one) == 0, "pinning the test to one core");
    dsv4_exec ex;
    dsv4_ctx *c = make(threads, &ex); /* its workers inherit the one core */
    if (!c) {
        sched_setaffinity(0, sizeof all, &all);
        return;
    }
    int64_t k[DSV4_POOL_COUNTS];
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        dsv4_par_for(&ex, 16, 1, work_fn, NULL);
        dsv4_pool_counts(ex.pool, k);
    } while (k[DSV4_POOL_TEAM] > 1 && ms_since(&t0) < 3000);
    CHECK(k[DSV4_POOL_SHRINKS] > 0 && k[DSV4_POOL_TEAM] == 1,
          "%d threads on one core: the team shrinks to one (%lld shrinks, team %lld, %.0f ms)", threads,
          (long long)k[DSV4_POOL_SHRINKS], (long long)k[DSV4_POOL_TEAM], ms_since(&t0));
    const int64_t alone = k[DSV4_POOL_LOOPS_ALONE], team = k[DSV4_POOL_LOOPS_TEAM], probes = k[DSV4_POOL_PROBES];
    dsv4_par_for(&ex, 16, 1, work_fn, NULL);
    dsv4_pool_counts(ex.pool, k);
    CHECK((k[DSV4_POOL_LOOPS_ALONE] == alone + 1 && k[DSV4_POOL_LOOPS_TEAM] == team) || k[DSV4_POOL_PROBES] > probes,
          "the next loop runs on the caller alone (unless 50 ms passed first and it probed)");
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        dsv4_par_for(&ex, 16, 1, work_fn, NULL);
        dsv4_pool_counts(ex.pool, k);
    } while (k[DSV4_POOL_PROBES] == 0 && ms_since(&t0) < 3000);
    CHECK(k[DSV4_POOL_PROBES] > 0 && k[DSV4_POOL_LOOPS_TEAM] > team, "a probe gives the worker loops again (%lld probes)",
          (long long)k[DSV4_POOL_PROBES]);
    clear_hits();
    for (int r = 0; r < 200; r++) dsv4_par_for(&ex, 1000, 7, count_fn, NULL); /* shrinking never loses an iteration */
    CHECK(hits_are(1000, 200), "loops while the team changes: an iteration ran not exactly once");
    dsv4_ctx_destroy(c);
    sched_setaffinity(0, sizeof all, &all);
}

/* The default thread count is the cores the process may run on (a taskset or a cpuset), not the
 * cores online: pinned to one core, a default context has one thread; unpinned, one per core of
 * the mask. */
static void test_affinity(void)
{
    cpu_set_t all, one;
    if (sched_getaffinity(0, sizeof all, &all) != 0) return;
    const char *env = getenv("DSV4_THREADS");
    char saved[64] = "";
    if (env) snprintf(saved, sizeof saved, "%s", env);
    unsetenv("DSV4_THREADS");
    const int n_all = CPU_COUNT(&all) < DSV4_MAX_THREADS ? CPU_COUNT(&all) : DSV4_MAX_THREADS;
    CHECK(dsv4_default_threads() == n_all, "default threads %d, the affinity mask has %d cores", dsv4_default_threads(),
          n_all);
    CPU_ZERO(&one);
    for (int i = CPU_SETSIZE - 1; i >= 0; i--) /* the last core of the mask: not simply core 0 */
        if (CPU_ISSET(i, &all)) {
            CPU_SET(i, &one);
            break;
        }
    if (sched_setaffinity(0, sizeof one, &one) == 0) {
        CHECK(dsv4_default_threads() == 1, "pinned to one core: default threads %d", dsv4_default_threads());
        dsv4_ctx *c = NULL;
        dsv4_ctx_options o = {.backend = "cpu"};
        CHECK(dsv4_ctx_create(&o, &c) == DSV4_OK && dsv4_ctx_threads(c) == 1, "pinned to one core: a default context has %d threads",
              c ? dsv4_ctx_threads(c) : -1);
        dsv4_ctx_destroy(c);
        sched_setaffinity(0, sizeof all, &all);
    }
    if (env) setenv("DSV4_THREADS", saved, 1);
}

int main(void)
{
    static const int threads[] = {1, 2, 3, 5, 8};
    static const int64_t sizes[] = {0, 1, 2, 7, 64, 1000, MAXN};
    for (size_t ti = 0; ti < sizeof threads / sizeof threads[0]; ti++) {
        const int T = threads[ti];
        dsv4_exec ex;
        dsv4_ctx *c = make(T, &ex);
        if (!c) continue;
        CHECK(dsv4_ctx_threads(c) == T, "threads %d", dsv4_ctx_threads(c));
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            const int64_t n = sizes[si], grains[] = {DSV4_PAR_AUTO, 1, 3, n > 0 ? n : 1, n + 5};
            for (size_t g = 0; g < sizeof grains / sizeof grains[0]; g++) {
                clear_hits();
                dsv4_par_for(&ex, n, grains[g], count_fn, NULL);
                CHECK(hits_are(n, 1), "par_for: %d threads, n %lld, grain %lld: an iteration ran not exactly once", T,
                      (long long)n, (long long)grains[g]);
                clear_hits();
                team_state st = {.threads = T};
                dsv4_par_team(&ex, n, grains[g], team_fn, &st);
                CHECK(!atomic_load(&st.bad) && hits_are(n, 1),
                      "par_team: %d threads, n %lld, grain %lld: a worker number shared or out of range, or an "
                      "iteration not run once",
                      T, (long long)n, (long long)grains[g]);
            }
        }
        /* back-to-back loops of few chunks: workers arriving late must find nothing to take */
        clear_hits();
        for (int r = 0; r < 5000; r++) dsv4_par_for(&ex, 2 * T, 1, count_fn, NULL);
        CHECK(hits_are(2 * T, 5000), "%d threads: 5000 loops of %d iterations", T, 2 * T);
        /* nested loops run whole on the thread of their chunk */
        clear_hits();
        nest_state ns = {&ex, 0};
        dsv4_par_for(&ex, 64, 1, outer_fn, &ns);
        CHECK(hits_are(64 * 16, 1) && !atomic_load(&ns.wrong_thread), "%d threads: nested loops", T);
        /* two application threads on one context */
        clear_hits();
        share_arg sa[2] = {{&ex, 0}, {&ex, 1000}};
        pthread_t th[2];
        int started = 0;
        for (int i = 0; i < 2; i++) started += pthread_create(&th[i], NULL, share_thread, &sa[i]) == 0;
        for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
        CHECK(started == 2 && hits_are(2000, 300), "%d threads: two callers sharing the context", T);
        /* a forked child has no workers: its loops still complete on the caller */
        clear_hits();
        pid_t pid = fork();
        if (pid == 0) {
            dsv4_par_for(&ex, 1000, 1, count_fn, NULL);
            _exit(hits_are(1000, 1) ? 0 : 1);
        }
        int status = -1;
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "%d threads: a loop in a forked child (status %d)", T, status);
        dsv4_ctx_destroy(c);
    }
    test_stall();
    test_competitor(2);
    test_competitor(4);
    test_affinity();
    TEST_DONE();
}
