/* The context's worker pool (core/pool.h; the wait policy: docs/kernels.md §11.1).
 *
 * One loop runs at a time. The caller publishes it (function, sizes), then one 64-bit ticket:
 * the loop's generation in the high half, the chunks not yet claimed in the low half. A thread
 * claims a chunk by a compare-and-swap that also checks the generation, so a worker that wakes
 * late can never claim a chunk of a loop that has finished or mix up two loops. Threads count
 * the chunks they ran into `done` when they leave the loop; the caller returns when done covers
 * every chunk, which is also the point after which no thread reads the loop's parameters. */
#define _GNU_SOURCE /* syscall(SYS_futex) */
#include "core/pool.h"
#include "core/error.h"

#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* How long a thread spins before it blocks: a worker after its last chunk (long enough to catch
 * the next loop of a forward pass without a wake-up; short next to a scheduler time slice, so a
 * pool with nothing to do leaves the cores to others soon), and the caller waiting for the last
 * chunks (a descheduled worker then gets the caller's core). */
#define WORKER_SPIN_NS 100000
#define CALLER_SPIN_NS 20000
/* The team (docs/kernels.md §11.1, "Competition"). The caller judges the team over windows of
 * WINDOW_NS (several scheduler slices, many forward steps of a small model; PROBE_NS while
 * competition was seen lately): the workers waited on a run queue (/proc's schedstat) for more
 * than 1/CONTENDED_DIV of the window, so another process holds their cores, and the team loses a
 * thread for HOLD_NS << (strikes - 1) (strikes: the shrinks, less one per WINDOW_NS of clean
 * windows of the whole team, at most MAX_STRIKES); then one thread more is the probe. A stall (the
 * caller, done with its chunks, waited over STALL_NS and 4 of its chunks' time for the others)
 * judges the window at once; without schedstat a stall alone is the sign. */
#define WINDOW_NS 10000000
#define PROBE_NS 2000000 /* the window after competition: short, as a contended one costs; a slice or more */
#define CONTENDED_DIV 8
#define WAKE_NS 20000 /* of each wait, the part a wake-up on an idle core takes (longer in a VM) */
#define HOLD_NS 50000000
#define MAX_STRIKES 6
#define STALL_NS 200000
#define MAX_CHUNKS (1u << 30) /* the ticket's low half; done must reach the count */

struct dsv4_pool {
    int threads;
    int n_started;
    pthread_t *tid;
    struct worker_arg { dsv4_pool *p; int id; } *args;
    atomic_int *delay_fd;  /* per worker: its /proc schedstat (-1: none) */
    atomic_int busy;       /* a loop is running: another one runs on its calling thread */
    uint32_t gen;          /* the caller's count of loops */
    /* the team control, the busy holder's: the threads that take part now, the window being judged
     * (its start, 0: none; the team's run-queue wait then), when the next probe starts */
    atomic_int team;
    int64_t win_start, win_delay, probe_at, clean_since; /* clean_since: the last probe or strike taken off */
    int strikes;
    int64_t counts[DSV4_POOL_COUNTS];
    /* the running loop (written before its ticket, read by the threads that claimed a chunk) */
    dsv4_par_team_fn fn;
    void *arg;
    int64_t n, grain;
    uint32_t chunks;
    atomic_int stop;
    _Alignas(64) _Atomic uint64_t ticket;
    _Alignas(64) _Atomic uint32_t epoch; /* futex of sleeping workers: moves with every loop */
    atomic_int sleepers;
    _Atomic uint32_t parked;             /* futex of workers outside the team: moves when it grows */
    _Alignas(64) _Atomic uint32_t done;  /* futex of the caller */
    atomic_int caller_waits;
};

struct dsv4_par_loop {
    dsv4_pool *p; /* NULL: the whole loop on this thread, as one chunk */
    uint32_t gen;
    int64_t first; /* a claimed chunk not handed out yet (-1: none) */
    int64_t n, grain;
    uint32_t count; /* chunks this thread claimed */
};

static void futex_wait(_Atomic uint32_t *a, uint32_t v)
{
    syscall(SYS_futex, (uint32_t *)a, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *a, int n) { syscall(SYS_futex, (uint32_t *)a, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0); }

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Spin while *a == v, at most budget_ns; returns 1 when it changed. */
static int spin_while(_Atomic uint32_t *a, uint32_t v, int64_t budget_ns)
{
    int64_t t0 = 0;
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(a, memory_order_acquire) != v) return 1;
        cpu_relax();
        if (i % 64 == 0) { /* the clock is read rarely: a few tens of ns each time */
            int64_t t = now_ns();
            if (!t0) t0 = t;
            else if (t - t0 > budget_ns) return 0;
        }
    }
}

/* One chunk of loop `gen`, if any is left. Chunks go out in order: 0, 1, ... */
static int claim(dsv4_pool *p, uint32_t gen, int64_t *chunk)
{
    uint64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
    while ((uint32_t)(t >> 32) == gen && (uint32_t)t > 0)
        if (atomic_compare_exchange_weak_explicit(&p->ticket, &t, t - 1, memory_order_acq_rel, memory_order_acquire)) {
            *chunk = (int64_t)(p->chunks - (uint32_t)t);
            return 1;
        }
    return 0;
}

int dsv4_par_next(dsv4_par_loop *l, int64_t *lo, int64_t *hi)
{
    int64_t c = l->first;
    l->first = -1;
    if (!l->p) {
        if (c < 0) return 0;
        *lo = 0;
        *hi = l->n;
        return 1;
    }
    if (c < 0) {
        if (!claim(l->p, l->gen, &c)) return 0;
        l->count++;
    }
    *lo = c * l->grain;
    *hi = *lo + l->grain < l->n ? *lo + l->grain : l->n;
    return 1;
}

/* Run the loop from a claimed chunk on, then count what this thread ran into done; returns that count. */
static uint32_t take_part(dsv4_pool *p, uint32_t gen, int64_t chunk, int id)
{
    dsv4_par_loop l = {p, gen, chunk, p->n, p->grain, 1};
    const uint32_t chunks = p->chunks;
    p->fn(p->arg, &l, id);
    /* past this add the caller may publish the next loop: nothing of p's loop is read after it */
    uint32_t now = atomic_fetch_add_explicit(&p->done, l.count, memory_order_acq_rel) + l.count;
    if (now == chunks && atomic_load(&p->caller_waits)) futex_wake(&p->done, 1);
    return l.count;
}

/* The time this thread has waited on a run queue, in ns, less WAKE_NS for each time it got a core
 * (/proc's schedstat: run time, run-queue time, times run); 0 where it cannot be read. */
static int run_queue_ns(int fd, int64_t *ns)
{
    char buf[96];
    ssize_t len = fd >= 0 ? pread(fd, buf, sizeof buf - 1, 0) : -1;
    if (len <= 0) return 0;
    buf[len] = '\0';
    char *end, *next;
    strtoll(buf, &end, 10);
    const long long q = strtoll(end, &next, 10), runs = strtoll(next, &end, 10);
    if (end == next || q < 0 || runs < 0) return 0;
    *ns = (int64_t)q - (int64_t)runs * WAKE_NS;
    return 1;
}

/* The same summed over the team's workers (INT64_MIN: unknown). */
static int64_t team_wait_ns(const dsv4_pool *p, int team)
{
    int64_t sum = 0, q;
    for (int i = 0; i < team - 1; i++) {
        if (!run_queue_ns(atomic_load_explicit(&p->delay_fd[i], memory_order_acquire), &q)) return INT64_MIN;
        sum += q;
    }
    return sum;
}

static void *worker_main(void *v)
{
    struct worker_arg *wa = v;
    dsv4_pool *p = wa->p;
    atomic_store_explicit(&p->delay_fd[wa->id - 1], open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC),
                          memory_order_release);
    for (;;) {
        uint32_t e = atomic_load(&p->epoch);
        if (atomic_load(&p->stop)) break;
        if (wa->id >= atomic_load_explicit(&p->team, memory_order_relaxed)) {
            /* outside the team: asleep until it grows (which moves `parked` after the team) */
            const uint32_t k = atomic_load(&p->parked);
            if (wa->id >= atomic_load(&p->team) && !atomic_load(&p->stop)) futex_wait(&p->parked, k);
            continue;
        }
        uint64_t t = atomic_load(&p->ticket);
        uint32_t gen = (uint32_t)(t >> 32);
        int64_t c;
        if (claim(p, gen, &c)) {
            take_part(p, gen, c, wa->id);
            continue;
        }
        /* nothing to claim: spin a little for the next loop, then sleep until the epoch moves (a
         * loop published after e was read has moved it, so no wake-up is lost) */
        if (spin_while(&p->epoch, e, WORKER_SPIN_NS)) continue;
        atomic_fetch_add(&p->sleepers, 1);
        futex_wait(&p->epoch, e);
        atomic_fetch_sub(&p->sleepers, 1);
    }
    return NULL;
}

dsv4_status dsv4_pool_create(int threads, dsv4_pool **out)
{
    DSV4_CHECK_ARG(out && threads >= 1, "pool: threads must be >= 1 (got %d)", threads);
    dsv4_pool *p = aligned_alloc(64, (sizeof *p + 63) / 64 * 64);
    if (!p) return dsv4_fail(DSV4_ERR_NO_MEMORY, "pool: out of memory");
    memset(p, 0, sizeof *p);
    p->threads = threads;
    atomic_init(&p->busy, 0);
    atomic_init(&p->team, threads);
    atomic_init(&p->stop, 0);
    atomic_init(&p->ticket, 0);
    atomic_init(&p->epoch, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->parked, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->caller_waits, 0);
    if (threads > 1) {
        p->tid = calloc((size_t)threads - 1, sizeof *p->tid);
        p->args = calloc((size_t)threads - 1, sizeof *p->args);
        p->delay_fd = malloc(((size_t)threads - 1) * sizeof *p->delay_fd);
        if (!p->tid || !p->args || !p->delay_fd) {
            dsv4_pool_destroy(p);
            return dsv4_fail(DSV4_ERR_NO_MEMORY, "pool: out of memory for %d threads", threads);
        }
        for (int i = 0; i < threads - 1; i++) atomic_init(&p->delay_fd[i], -1);
        /* workers take no signals: they stay with the application's threads */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int err = 0;
        for (int i = 0; i < threads - 1 && !err; i++) {
            p->args[i] = (struct worker_arg){p, i + 1};
            err = pthread_create(&p->tid[i], NULL, worker_main, &p->args[i]);
            if (!err) p->n_started++;
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (err) {
            dsv4_pool_destroy(p);
            return dsv4_fail(DSV4_ERR_NO_MEMORY, "pool: cannot start worker thread %d of %d: %s", p->n_started + 1,
                             threads - 1, strerror(err));
        }
    }
    *out = p;
    return DSV4_OK;
}

void dsv4_pool_destroy(dsv4_pool *p)
{
    if (!p) return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->epoch, 1);
    atomic_fetch_add(&p->parked, 1);
    futex_wake(&p->epoch, INT_MAX);
    futex_wake(&p->parked, INT_MAX);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->tid[i], NULL);
    for (int i = 0; i < p->n_started; i++)
        if (atomic_load(&p->delay_fd[i]) >= 0) close(atomic_load(&p->delay_fd[i])); /* started: delay_fd is there */
    free(p->tid);
    free(p->args);
    free((void *)p->delay_fd);
    free(p);
}

void dsv4_pool_counts(const dsv4_pool *p, int64_t out[DSV4_POOL_COUNTS])
{
    for (int i = 0; i < DSV4_POOL_COUNTS; i++) out[i] = p ? p->counts[i] : 0;
    out[DSV4_POOL_TEAM] = p ? atomic_load(&p->team) : 1;
}

static void set_team(dsv4_pool *p, int team)
{
    const int was = atomic_load_explicit(&p->team, memory_order_relaxed);
    atomic_store(&p->team, team);
    if (team > was) { /* the workers it takes back sleep on `parked` */
        atomic_fetch_add(&p->parked, 1);
        futex_wake(&p->parked, INT_MAX);
    }
}

/* A new window for a team of `team`: its workers' run-queue time now. */
static void open_window(dsv4_pool *p, int team, int64_t now)
{
    p->win_start = now;
    p->win_delay = team_wait_ns(p, team);
}

/* The end of a team loop at `now`: judge the window when it is over or a stall came. Windows are
 * short (PROBE_NS) while competition was seen lately (strikes), so a probe or a return of the
 * competitor costs little. The team of a contended window loses the threads whose core another
 * process took (at least one) for HOLD_NS << (strikes - 1), each shrink doubling it; each
 * WINDOW_NS of clean windows of the whole team takes a strike off. */
static void judge(dsv4_pool *p, int team, int64_t now, int stall)
{
    const int64_t span = now - p->win_start;
    if (!p->win_start) {
        open_window(p, team, now);
        return;
    }
    const int64_t len = p->strikes > 0 ? PROBE_NS : WINDOW_NS;
    if (!stall && span < len) return;
    const int64_t q = p->win_delay != INT64_MIN ? team_wait_ns(p, team) : INT64_MIN;
    const int64_t waited = q != INT64_MIN ? q - p->win_delay : -1;
    const int contended = q != INT64_MIN ? waited * CONTENDED_DIV > span : stall;
    if (contended) {
        const int64_t lost = span > 0 && waited > span ? waited / span : 1;
        const int next = team - lost > 1 ? team - (int)lost : 1;
        p->strikes += p->strikes < MAX_STRIKES;
        p->probe_at = now + ((int64_t)HOLD_NS << (p->strikes - 1));
        p->win_start = 0;
        p->counts[DSV4_POOL_SHRINKS]++;
        set_team(p, next);
    } else if (span >= len) {
        if (p->strikes > 0 && team == p->threads && now - p->clean_since >= WINDOW_NS) {
            p->strikes--;
            p->clean_since = now;
        }
        open_window(p, team, now);
    }
}

void dsv4_par_team(const dsv4_exec *ex, int64_t n, int64_t grain, dsv4_par_team_fn fn, void *arg)
{
    if (n <= 0) return;
    dsv4_pool *p = ex->pool;
    const int64_t T = p ? p->threads : 1;
    const int64_t g = grain > 0 ? grain : (n + 4 * T - 1) / (4 * T);
    if (T < 2 || (n + g - 1) / g < 2 || atomic_exchange_explicit(&p->busy, 1, memory_order_acquire)) {
        dsv4_par_loop l = {NULL, 0, 0, n, n, 0};
        fn(arg, &l, 0);
        return;
    }
    int team = atomic_load_explicit(&p->team, memory_order_relaxed);
    const int64_t t0 = now_ns();
    if (team < T && t0 >= p->probe_at) { /* the probe: one thread more for a window */
        set_team(p, ++team);
        p->clean_since = t0;
        p->counts[DSV4_POOL_PROBES]++;
        open_window(p, team, t0);
    }
    if (team < 2) { /* another process has the other cores: this loop on the caller alone */
        p->counts[DSV4_POOL_LOOPS_ALONE]++;
        dsv4_par_loop l = {NULL, 0, 0, n, n, 0};
        fn(arg, &l, 0);
        p->counts[DSV4_POOL_ALONE_NS] += now_ns() - t0;
        atomic_store_explicit(&p->busy, 0, memory_order_release);
        return;
    }
    if (grain <= 0) grain = (n + 4 * team - 1) / (4 * team);
    if (n / grain >= MAX_CHUNKS) grain = (n + MAX_CHUNKS - 2) / (MAX_CHUNKS - 1);
    const int64_t chunks = (n + grain - 1) / grain;
    p->counts[DSV4_POOL_LOOPS_TEAM]++;
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->grain = grain;
    p->chunks = (uint32_t)chunks;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    const uint32_t gen = ++p->gen;
    atomic_store(&p->ticket, (uint64_t)gen << 32 | (uint64_t)chunks);
    atomic_fetch_add(&p->epoch, 1);
    if (atomic_load(&p->sleepers) > 0) futex_wake(&p->epoch, (int)(chunks - 1 < team - 1 ? chunks - 1 : team - 1));
    int64_t c;
    uint32_t own = 0;
    if (claim(p, gen, &c)) own = take_part(p, gen, c, 0);
    const int64_t t1 = now_ns();
    uint32_t d;
    while ((d = atomic_load_explicit(&p->done, memory_order_acquire)) != (uint32_t)chunks) {
        if (spin_while(&p->done, d, CALLER_SPIN_NS)) continue;
        atomic_store(&p->caller_waits, 1);
        if (atomic_load(&p->done) == d) futex_wait(&p->done, d);
        atomic_store(&p->caller_waits, 0);
    }
    /* the caller's own chunks time the others': far longer is a worker off its core */
    const int64_t t2 = now_ns(), waited = t2 - t1;
    const int stall = own && waited > STALL_NS && waited > 4 * ((t1 - t0) / own);
    if (stall) {
        p->counts[DSV4_POOL_STALLS]++;
        p->counts[DSV4_POOL_STALL_NS] += waited;
    }
    p->counts[DSV4_POOL_TEAM_NS] += t2 - t0;
    judge(p, team, t2, stall);
    atomic_store_explicit(&p->busy, 0, memory_order_release);
}

typedef struct {
    dsv4_par_fn fn;
    void *arg;
} plain_loop;

static void plain_team(void *v, dsv4_par_loop *l, int worker)
{
    const plain_loop *pl = v;
    int64_t lo, hi;
    while (dsv4_par_next(l, &lo, &hi)) pl->fn(pl->arg, lo, hi);
}

void dsv4_par_for(const dsv4_exec *ex, int64_t n, int64_t grain, dsv4_par_fn fn, void *arg)
{
    plain_loop pl = {fn, arg};
    dsv4_par_team(ex, n, grain, plain_team, &pl);
}
