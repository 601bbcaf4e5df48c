/* Communicators (include/dsv4/comm.h): the functions every implementation shares, and the
 * loopback group of N ranks that are threads of one process.
 *
 * A communicator is an ops table and a rank. The loopback's collectives meet in two barriers:
 * after the first every rank's buffer is published, between them rank r computes (all-reduce) or
 * copies (all-gather) its own fixed slice into every rank's buffer, and the second lets no rank
 * return, and change its buffer, while another still reads it. Each element's sum is formed by
 * one rank in rank order, so the bits depend on nothing but the inputs.
 *
 * An NCCL implementation (not built: no NCCL here) is one more ops table: ncclAllReduce with
 * ncclSum on F32 does not promise the rank order (its ring and tree orders differ), so it needs
 * ncclAllGather of the partial sums and the ordered sum on every rank, or an accepted tolerance
 * (docs/engine.md §9). */
#include "core/error.h"
#include "dsv4/comm.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct dsv4_comm_ops {
    dsv4_status (*all_reduce_f32)(dsv4_comm *c, float *buf, int64_t n);
    dsv4_status (*all_gather)(dsv4_comm *c, void *buf, size_t bytes);
    dsv4_status (*barrier)(dsv4_comm *c);
    void (*abort)(dsv4_comm *c);
    void (*destroy)(dsv4_comm *c);
} dsv4_comm_ops;

struct dsv4_comm {
    const dsv4_comm_ops *ops;
    int rank, size;
    void *impl;
};

int dsv4_comm_rank(const dsv4_comm *c) { return c ? c->rank : 0; }
int dsv4_comm_size(const dsv4_comm *c) { return c ? c->size : 1; }

dsv4_status dsv4_comm_all_reduce_f32(dsv4_comm *c, float *buf, int64_t n)
{
    DSV4_CHECK_ARG(c && n >= 0 && (buf || !n), "comm_all_reduce_f32: null communicator or buffer, or n < 0");
    return c->size == 1 ? DSV4_OK : c->ops->all_reduce_f32(c, buf, n);
}

dsv4_status dsv4_comm_all_gather(dsv4_comm *c, void *buf, size_t bytes)
{
    DSV4_CHECK_ARG(c && (buf || !bytes), "comm_all_gather: null communicator or buffer");
    return c->size == 1 ? DSV4_OK : c->ops->all_gather(c, buf, bytes);
}

dsv4_status dsv4_comm_barrier(dsv4_comm *c)
{
    DSV4_CHECK_ARG(c, "comm_barrier: null communicator");
    return c->size == 1 ? DSV4_OK : c->ops->barrier(c);
}

void dsv4_comm_abort(dsv4_comm *c)
{
    if (c) c->ops->abort(c);
}

void dsv4_comm_destroy(dsv4_comm *c)
{
    if (c) c->ops->destroy(c);
}

/* ---- loopback -------------------------------------------------------------------------------- */
typedef struct loop_group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n, arrived, aborted, refs;
    uint64_t gen;
    void **bufs;     /* [n] the buffers of the collective under way */
    int64_t *counts; /* [n] its sizes, as each rank gave them */
} loop_group;

static dsv4_status loop_failed(void) { return dsv4_fail(DSV4_ERR_BACKEND, "comm: the group was aborted (a rank failed)"); }

/* Wait until every rank has arrived (or the group is aborted). */
static dsv4_status loop_wait(loop_group *g)
{
    pthread_mutex_lock(&g->mu);
    int aborted = g->aborted;
    if (!aborted && ++g->arrived == g->n) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    } else if (!aborted) {
        const uint64_t gen = g->gen;
        while (g->gen == gen && !g->aborted) pthread_cond_wait(&g->cv, &g->mu);
        aborted = g->gen == gen;
    }
    pthread_mutex_unlock(&g->mu);
    return aborted ? loop_failed() : DSV4_OK;
}

static void loop_abort(dsv4_comm *c)
{
    loop_group *g = c->impl;
    pthread_mutex_lock(&g->mu);
    g->aborted = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* Publish buf and its size; every rank checks that the sizes agree (all see the same table). */
static dsv4_status loop_publish(dsv4_comm *c, const char *op, void *buf, int64_t count)
{
    loop_group *g = c->impl;
    g->bufs[c->rank] = buf;
    g->counts[c->rank] = count;
    DSV4_TRY(loop_wait(g));
    for (int r = 1; r < g->n; r++)
        if (g->counts[r] != g->counts[0]) {
            loop_abort(c);
            return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: rank %d gave %lld elements, rank 0 %lld", op, r,
                             (long long)g->counts[r], (long long)g->counts[0]);
        }
    return DSV4_OK;
}

static dsv4_status loop_all_reduce(dsv4_comm *c, float *buf, int64_t n)
{
    loop_group *g = c->impl;
    DSV4_TRY(loop_publish(c, "comm_all_reduce_f32", buf, n));
    const int64_t lo = n * c->rank / g->n, hi = n * (c->rank + 1) / g->n;
    float *const *b = (float *const *)g->bufs;
    for (int64_t i = lo; i < hi; i++) {
        float s = b[0][i];
        for (int r = 1; r < g->n; r++) s += b[r][i];
        for (int r = 0; r < g->n; r++) b[r][i] = s;
    }
    return loop_wait(g);
}

static dsv4_status loop_all_gather(dsv4_comm *c, void *buf, size_t bytes)
{
    loop_group *g = c->impl;
    DSV4_TRY(loop_publish(c, "comm_all_gather", buf, (int64_t)bytes));
    const size_t at = (size_t)c->rank * bytes;
    for (int r = 0; r < g->n; r++)
        if (r != c->rank) memcpy((char *)g->bufs[r] + at, (const char *)buf + at, bytes);
    return loop_wait(g);
}

static dsv4_status loop_barrier(dsv4_comm *c) { return loop_wait(c->impl); }

static void loop_group_free(loop_group *g)
{
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g->bufs);
    free(g->counts);
    free(g);
}

static void loop_destroy(dsv4_comm *c)
{
    loop_group *g = c->impl;
    pthread_mutex_lock(&g->mu);
    const int last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (last) loop_group_free(g);
    free(c);
}

static const dsv4_comm_ops loop_ops = {loop_all_reduce, loop_all_gather, loop_barrier, loop_abort, loop_destroy};

dsv4_status dsv4_comm_loopback_create(int n, dsv4_comm **comms)
{
    DSV4_CHECK_ARG(comms && n >= 1 && n <= 1024, "comm_loopback_create: need 1 <= n <= 1024 and an output array");
    loop_group *g = calloc(1, sizeof *g);
    dsv4_comm **made = calloc((size_t)n, sizeof *made);
    int ok = g && made;
    if (ok) {
        g->n = n;
        g->bufs = calloc((size_t)n, sizeof *g->bufs);
        g->counts = calloc((size_t)n, sizeof *g->counts);
        ok = g->bufs && g->counts;
    }
    ok = ok && pthread_mutex_init(&g->mu, NULL) == 0;
    if (ok && pthread_cond_init(&g->cv, NULL) != 0) {
        pthread_mutex_destroy(&g->mu);
        ok = 0;
    }
    for (int r = 0; r < n && ok; r++) {
        made[r] = calloc(1, sizeof **made);
        if (!made[r]) break;
        *made[r] = (dsv4_comm){&loop_ops, r, n, g};
        g->refs++;
    }
    if (!ok || g->refs != n) {
        for (int r = 0; made && r < n; r++) free(made[r]);
        if (ok) loop_group_free(g);
        else if (g) {
            free(g->bufs);
            free(g->counts);
            free(g);
        }
        free(made);
        return dsv4_fail(DSV4_ERR_NO_MEMORY, "comm_loopback_create: out of memory");
    }
    memcpy(comms, made, (size_t)n * sizeof *made);
    free(made);
    return DSV4_OK;
}
