/* The context's fixed pool of CPU worker threads (docs/kernels.md §11.1).
 *
 * A context with T threads owns T - 1 workers, created with it and joined when it is destroyed;
 * the thread that calls an op is the T-th and works too. A parallel loop over [0, n) is cut into
 * chunks of `grain` iterations that threads claim one at a time as they come free (so a worker
 * that another process keeps off its core holds back at most the chunk it runs); which thread
 * runs which chunk never changes a result, because every kernel computes each of its iterations
 * whole, in a fixed order. Nothing is allocated per loop.
 *
 * Waits spin briefly, then block on a futex: idle workers go to sleep soon after the last loop,
 * and the caller, waiting for a chunk a descheduled worker still runs, gives its core away.
 * A loop run while the pool is busy (a call nested in a chunk, or a second thread calling ops of
 * the same context) runs whole on the calling thread, as worker 0. */
#ifndef DSV4_CORE_POOL_H
#define DSV4_CORE_POOL_H

#include "core/backend.h"

#include <stdint.h>

typedef struct dsv4_pool dsv4_pool;

/* threads >= 1 (1: no workers, every loop runs on the caller). */
dsv4_status dsv4_pool_create(int threads, dsv4_pool **out);
void dsv4_pool_destroy(dsv4_pool *p);

/* One thread's share of a loop: dsv4_par_next hands it chunk after chunk, [*lo, *hi), and
 * returns 0 when none is left. */
typedef struct dsv4_par_loop dsv4_par_loop;
int dsv4_par_next(dsv4_par_loop *l, int64_t *lo, int64_t *hi);

/* A team loop: every thread that takes part runs fn once, with its worker number (0 .. threads-1,
 * distinct among the threads running this loop: an index into per-thread scratch), and pulls its
 * chunks through dsv4_par_next; state that spans a thread's chunks lives in fn's frame. A thread
 * may take no chunk at all, and then does not call fn. */
typedef void (*dsv4_par_team_fn)(void *arg, dsv4_par_loop *l, int worker);
void dsv4_par_team(const dsv4_exec *ex, int64_t n, int64_t grain, dsv4_par_team_fn fn, void *arg);

/* A plain loop: fn(arg, lo, hi) for chunks [lo, hi) covering [0, n), each once. */
typedef void (*dsv4_par_fn)(void *arg, int64_t lo, int64_t hi);
void dsv4_par_for(const dsv4_exec *ex, int64_t n, int64_t grain, dsv4_par_fn fn, void *arg);

/* What the pool's team control did so far (the DSV4_POOL_* indices of dsv4/core.h); a NULL pool
 * gives zeros and a team of 1. Read it while no loop runs. */
void dsv4_pool_counts(const dsv4_pool *p, int64_t out[DSV4_POOL_COUNTS]);

/* grain DSV4_PAR_AUTO: about 4 chunks per thread; grain >= n: the whole loop on the caller (for
 * work too small to pay for waking a worker). */
#define DSV4_PAR_AUTO 0

#endif
