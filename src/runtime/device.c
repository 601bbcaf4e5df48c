/* Runtime of the memory family (include/dsv4/device.h): device memory, timers, streams and graph
 * capture. Argument checks, then the backend's memory table; backends without one (the CPU
 * backends) are served from host memory here. */
#include "core/error.h"
#include "core/ops_memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

dsv4_device_kind dsv4_ctx_device_kind(dsv4_ctx *ctx)
{
    const dsv4_backend *b;
    dsv4_exec ex;
    return dsv4_op_resolve(ctx, "ctx_device_kind", DSV4_FAMILY_NONE, &b, &ex) == DSV4_OK ? b->device : DSV4_DEVICE_CPU;
}

dsv4_status dsv4_device_info_get(dsv4_ctx *ctx, dsv4_device_info *info)
{
    DSV4_CHECK_ARG(info, "device_info: null output");
    const dsv4_backend *b;
    dsv4_exec ex;
    DSV4_TRY(dsv4_op_resolve(ctx, "device_info", DSV4_FAMILY_NONE, &b, &ex));
    memset(info, 0, sizeof *info);
    if (b->memory) return b->memory->info(&ex, info);
    snprintf(info->name, sizeof info->name, "host (%s)", b->name);
    info->multiprocessors = ex.threads;
    return DSV4_OK;
}

/* The backend's memory (`host` 0) or its staging host memory (`host` 1); host memory (256-byte
 * aligned) for backends without a memory table. */
static dsv4_status host_or_device_alloc(dsv4_ctx *ctx, const char *op, int host, size_t bytes, void **ptr)
{
    DSV4_CHECK_ARG(ptr, "%s: null output pointer", op);
    const dsv4_backend *b;
    dsv4_exec ex;
    DSV4_TRY(dsv4_op_resolve(ctx, op, DSV4_FAMILY_NONE, &b, &ex));
    if (b->memory && (host ? b->memory->host_alloc : b->memory->alloc))
        return (host ? b->memory->host_alloc : b->memory->alloc)(&ex, bytes, ptr);
    size_t rounded = (bytes + 255) / 256 * 256;
    void *p = aligned_alloc(256, rounded ? rounded : 256);
    if (!p) return dsv4_fail(DSV4_ERR_NO_MEMORY, "%s: %zu bytes of host memory not available", op, bytes);
    *ptr = p;
    return DSV4_OK;
}

dsv4_status dsv4_device_alloc(dsv4_ctx *ctx, size_t bytes, void **ptr)
{
    return host_or_device_alloc(ctx, "device_alloc", 0, bytes, ptr);
}

/* The other side of host_or_device_alloc. */
static dsv4_status host_or_device_free(dsv4_ctx *ctx, const char *op, int host, void *ptr)
{
    if (!ptr) return DSV4_OK;
    const dsv4_backend *b;
    dsv4_exec ex;
    DSV4_TRY(dsv4_op_resolve(ctx, op, DSV4_FAMILY_NONE, &b, &ex));
    if (b->memory && (host ? b->memory->host_free : b->memory->free))
        return (host ? b->memory->host_free : b->memory->free)(&ex, ptr);
    free(ptr);
    return DSV4_OK;
}

dsv4_status dsv4_device_free(dsv4_ctx *ctx, void *ptr) { return host_or_device_free(ctx, "device_free", 0, ptr); }

dsv4_status dsv4_device_host_alloc(dsv4_ctx *ctx, size_t bytes, void **ptr)
{
    return host_or_device_alloc(ctx, "device_host_alloc", 1, bytes, ptr);
}

dsv4_status dsv4_device_host_free(dsv4_ctx *ctx, void *ptr)
{
    return host_or_device_free(ctx, "device_host_free", 1, ptr);
}

/* The four transfers share their checks; `which` picks the backend entry. */
enum { XFER_UP, XFER_DOWN, XFER_COPY, XFER_UP_ASYNC };

static dsv4_status transfer(dsv4_ctx *ctx, int which, void *dst, const void *src, size_t bytes)
{
    static const char *const names[] = {"device_upload", "device_download", "device_copy", "device_upload_async"};
    if (!bytes) return DSV4_OK;
    DSV4_CHECK_ARG(dst && src, "%s: null pointer", names[which]);
    const dsv4_backend *b;
    dsv4_exec ex;
    DSV4_TRY(dsv4_op_resolve(ctx, names[which], DSV4_FAMILY_NONE, &b, &ex));
    DSV4_OP_TIMER(names[which], b, &ex);
    if (!b->memory) {
        memmove(dst, src, bytes);
        return DSV4_OK;
    }
    if (which == XFER_UP) return b->memory->upload(&ex, dst, src, bytes);
    if (which == XFER_DOWN) return b->memory->download(&ex, dst, src, bytes);
    if (which == XFER_UP_ASYNC)
        return b->memory->upload_async ? b->memory->upload_async(&ex, dst, src, bytes) : b->memory->upload(&ex, dst, src, bytes);
    return b->memory->copy(&ex, dst, src, bytes);
}

dsv4_status dsv4_device_upload(dsv4_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    return transfer(ctx, XFER_UP, dst, src, bytes);
}

dsv4_status dsv4_device_upload_async(dsv4_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    return transfer(ctx, XFER_UP_ASYNC, dst, src, bytes);
}

dsv4_status dsv4_device_download(dsv4_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    return transfer(ctx, XFER_DOWN, dst, src, bytes);
}

dsv4_status dsv4_device_copy(dsv4_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    return transfer(ctx, XFER_COPY, dst, src, bytes);
}

dsv4_status dsv4_device_memset(dsv4_ctx *ctx, void *dst, int value, size_t bytes)
{
    if (!bytes) return DSV4_OK;
    DSV4_CHECK_ARG(dst, "device_memset: null pointer");
    const dsv4_backend *b;
    dsv4_exec ex;
    DSV4_TRY(dsv4_op_resolve(ctx, "device_memset", DSV4_FAMILY_NONE, &b, &ex));
    DSV4_OP_TIMER("device_memset", b, &ex);
    if (b->memory) return b->memory->memset(&ex, dst, value, bytes);
    memset(dst, value, bytes);
    return DSV4_OK;
}

dsv4_status dsv4_device_sync(dsv4_ctx *ctx)
{
    const dsv4_backend *b;
    dsv4_exec ex;
    DSV4_TRY(dsv4_op_resolve(ctx, "device_sync", DSV4_FAMILY_NONE, &b, &ex));
    return b->memory ? b->memory->sync(&ex) : DSV4_OK;
}

dsv4_status dsv4_device_tensor_alloc(dsv4_ctx *ctx, dsv4_tensor *t, dsv4_dtype dtype, int ndim, const int64_t *shape)
{
    DSV4_CHECK_ARG(t, "device_tensor_alloc: null tensor");
    dsv4_tensor v;
    /* The view's checks (dtype, dims, shape) with a stand-in pointer, before allocating. */
    DSV4_TRY(dsv4_tensor_init(&v, (void *)t, dtype, ndim, shape));
    int64_t n = dsv4_tensor_numel(&v);
    size_t bytes = (size_t)n * dsv4_dtype_size(dtype);
    const dsv4_backend *b;
    dsv4_exec ex;
    DSV4_TRY(dsv4_op_resolve(ctx, "device_tensor_alloc", DSV4_FAMILY_NONE, &b, &ex));
    void *p = NULL;
    DSV4_TRY(dsv4_device_alloc(ctx, bytes, &p));
    v.data = p;
    v.device = b->device;
    v.device_index = b->device == DSV4_DEVICE_CPU ? 0 : ex.device;
    *t = v;
    return DSV4_OK;
}

dsv4_status dsv4_device_tensor_free(dsv4_ctx *ctx, dsv4_tensor *t)
{
    if (!t || !t->data) return DSV4_OK;
    DSV4_TRY(dsv4_device_free(ctx, t->data));
    t->data = NULL;
    return DSV4_OK;
}

/* ---- timers ------------------------------------------------------------------------------ */
struct dsv4_device_timer {
    const dsv4_backend *b;
    dsv4_exec ex;
    void *handle;        /* backend timer */
    double host[2];      /* host clock (backends without a memory table) */
};

static double host_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

dsv4_status dsv4_device_timer_create(dsv4_ctx *ctx, dsv4_device_timer **timer)
{
    DSV4_CHECK_ARG(timer, "device_timer_create: null output");
    dsv4_device_timer *t = calloc(1, sizeof *t);
    if (!t) return dsv4_fail(DSV4_ERR_NO_MEMORY, "device_timer_create: out of memory");
    dsv4_status s = dsv4_op_resolve(ctx, "device_timer_create", DSV4_FAMILY_NONE, &t->b, &t->ex);
    if (s == DSV4_OK && t->b->memory) s = t->b->memory->timer_create(&t->ex, &t->handle);
    if (s != DSV4_OK) {
        free(t);
        return s;
    }
    *timer = t;
    return DSV4_OK;
}

static dsv4_status timer_mark(dsv4_device_timer *t, int end)
{
    DSV4_CHECK_ARG(t, "device_timer: null timer");
    if (t->b->memory) return t->b->memory->timer_record(&t->ex, t->handle, end);
    t->host[end] = host_seconds();
    return DSV4_OK;
}

dsv4_status dsv4_device_timer_start(dsv4_device_timer *timer) { return timer_mark(timer, 0); }
dsv4_status dsv4_device_timer_stop(dsv4_device_timer *timer) { return timer_mark(timer, 1); }

dsv4_status dsv4_device_timer_elapsed_ms(dsv4_device_timer *timer, double *ms)
{
    DSV4_CHECK_ARG(timer && ms, "device_timer_elapsed_ms: null argument");
    if (timer->b->memory) return timer->b->memory->timer_elapsed(&timer->ex, timer->handle, ms);
    *ms = 1e3 * (timer->host[1] - timer->host[0]);
    return DSV4_OK;
}

void dsv4_device_timer_destroy(dsv4_device_timer *timer)
{
    if (!timer) return;
    if (timer->b->memory && timer->handle) timer->b->memory->timer_destroy(timer->handle);
    free(timer);
}

/* ---- graphs ------------------------------------------------------------------------------ */
struct dsv4_device_graph {
    const dsv4_backend *b;
    dsv4_exec ex;
    void *handle;
};

dsv4_status dsv4_device_stream_set(dsv4_ctx *ctx, void *stream)
{
    DSV4_CHECK_ARG(ctx, "device_stream_set: the default context keeps its default stream (pass a context)");
    const dsv4_backend *b;
    dsv4_exec ex;
    DSV4_TRY(dsv4_op_resolve(ctx, "device_stream_set", DSV4_FAMILY_NONE, &b, &ex));
    if (stream) {
        if (!b->memory || !b->memory->stream_check)
            return dsv4_fail(DSV4_ERR_UNSUPPORTED, "device_stream_set: backend '%s' has no streams (only NULL)", b->name);
        DSV4_TRY(b->memory->stream_check(&ex, stream));
    }
    return dsv4_ctx_set_stream(ctx, stream);
}

dsv4_status dsv4_device_stream_get(dsv4_ctx *ctx, void **stream)
{
    DSV4_CHECK_ARG(stream, "device_stream_get: null output");
    const dsv4_backend *b;
    dsv4_exec ex;
    DSV4_TRY(dsv4_op_resolve(ctx, "device_stream_get", DSV4_FAMILY_NONE, &b, &ex));
    *stream = ex.stream;
    return DSV4_OK;
}

static dsv4_status graph_backend(dsv4_ctx *ctx, const char *op, const dsv4_backend **b, dsv4_exec *ex)
{
    DSV4_TRY(dsv4_op_resolve(ctx, op, DSV4_FAMILY_NONE, b, ex));
    if (!(*b)->memory || !(*b)->memory->graph_begin)
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: backend '%s' has no graphs", op, (*b)->name);
    return DSV4_OK;
}

dsv4_status dsv4_device_graph_begin(dsv4_ctx *ctx)
{
    const dsv4_backend *b;
    dsv4_exec ex;
    DSV4_TRY(graph_backend(ctx, "device_graph_begin", &b, &ex));
    return b->memory->graph_begin(&ex);
}

dsv4_status dsv4_device_graph_end(dsv4_ctx *ctx, dsv4_device_graph **graph)
{
    DSV4_CHECK_ARG(graph, "device_graph_end: null output");
    const dsv4_backend *b;
    dsv4_exec ex;
    DSV4_TRY(graph_backend(ctx, "device_graph_end", &b, &ex));
    dsv4_device_graph *g = calloc(1, sizeof *g);
    if (!g) return dsv4_fail(DSV4_ERR_NO_MEMORY, "device_graph_end: out of memory");
    dsv4_status s = b->memory->graph_end(&ex, &g->handle);
    if (s != DSV4_OK) {
        free(g);
        return s;
    }
    g->b = b;
    g->ex = ex;
    *graph = g;
    return DSV4_OK;
}

dsv4_status dsv4_device_graph_launch(dsv4_device_graph *graph)
{
    DSV4_CHECK_ARG(graph, "device_graph_launch: null graph");
    return graph->b->memory->graph_launch(&graph->ex, graph->handle);
}

void dsv4_device_graph_destroy(dsv4_device_graph *graph)
{
    if (!graph) return;
    graph->b->memory->graph_destroy(graph->handle);
    free(graph);
}
