/* Where the time of a forward pass goes, op by op (DSV4_PROFILE_OPS=1; docs/backends.md §7): every
 * public op waits for the device before it starts and before it returns, and its wall time is added
 * to the op's row; the table goes to stderr at exit, largest total first. The waits make each row
 * the op's own host and device time (the stream is drained between ops), so the total is slower
 * than an unprofiled run: it shows the split, not the speed. An op called by another is counted in
 * both. Not for graph capture (a wait inside a capture fails it). Off: one branch per op. */
#include "core/backend.h"
#include "core/ops_memory.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MAX_ROWS = 128 };

static struct {
    const char *op; /* the op's name literal (compared by pointer first, then by text) */
    int64_t calls;
    double seconds;
} rows[MAX_ROWS];
static int n_rows;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int enabled;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int by_total(const void *a, const void *b)
{
    const double x = ((const __typeof__(rows[0]) *)a)->seconds, y = ((const __typeof__(rows[0]) *)b)->seconds;
    return (x < y) - (x > y);
}

static void report(void)
{
    pthread_mutex_lock(&lock);
    qsort(rows, (size_t)n_rows, sizeof rows[0], by_total);
    double total = 0.0;
    for (int i = 0; i < n_rows; i++) total += rows[i].seconds;
    fprintf(stderr, "dsv4 op profile (DSV4_PROFILE_OPS): %d ops, %.3f s in all (nested ops counted twice)\n", n_rows, total);
    fprintf(stderr, "%-28s %10s %12s %10s %7s\n", "op", "calls", "total ms", "us/call", "share");
    for (int i = 0; i < n_rows; i++)
        fprintf(stderr, "%-28s %10lld %12.3f %10.2f %6.1f%%\n", rows[i].op, (long long)rows[i].calls, rows[i].seconds * 1e3,
                rows[i].seconds * 1e6 / (double)rows[i].calls, total > 0 ? 100.0 * rows[i].seconds / total : 0.0);
    pthread_mutex_unlock(&lock);
}

static void setup(void)
{
    const char *v = getenv("DSV4_PROFILE_OPS");
    enabled = v && v[0] && strcmp(v, "0");
    if (enabled) atexit(report);
}

static void wait_device(const dsv4_backend *b, const dsv4_exec *ex)
{
    if (b && b->memory) b->memory->sync(ex);
}

dsv4_op_timer dsv4_op_timer_begin(const char *op, const dsv4_backend *b, const dsv4_exec *ex)
{
    pthread_once(&once, setup);
    dsv4_op_timer t = {NULL, NULL, {0}, 0.0};
    if (!enabled) return t;
    t.op = op, t.b = b, t.ex = *ex;
    wait_device(b, ex);
    t.t0 = now_s();
    return t;
}

void dsv4_op_timer_end(dsv4_op_timer *t)
{
    if (!t->op) return;
    wait_device(t->b, &t->ex);
    const double dt = now_s() - t->t0;
    pthread_mutex_lock(&lock);
    int i = 0;
    while (i < n_rows && rows[i].op != t->op && strcmp(rows[i].op, t->op)) i++;
    if (i < MAX_ROWS) {
        if (i == n_rows) rows[n_rows++].op = t->op;
        rows[i].calls++;
        rows[i].seconds += dt;
    }
    pthread_mutex_unlock(&lock);
}
