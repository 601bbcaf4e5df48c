/* The "cuda" backend: registration, availability, device memory (core/ops_memory.h), and the
 * host helpers every CUDA op uses. Device buffers, events, graphs and streams belong to the
 * caller's handles; the backend keeps no global state and changes none (the current device is
 * switched for a call only when the context names another one, then restored). */
#include "backends/cuda/cuda_glue.h"
#include "core/error.h"
#include "core/ops_attention.h"
#include "core/ops_memory.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

void *dsv4_cu_stream(const dsv4_exec *ex) { return ex->stream ? ex->stream : (void *)cudaStreamPerThread; }

dsv4_status dsv4_cu_status(int err, const char *op)
{
    if (err == cudaSuccess) return DSV4_OK;
    cudaError_t e = (cudaError_t)err;
    return dsv4_fail(DSV4_ERR_BACKEND, "%s: CUDA error %s (%s)", op, cudaGetErrorName(e), cudaGetErrorString(e));
}

dsv4_status dsv4_cu_enter(const dsv4_exec *ex, const char *op, dsv4_cu_guard *g)
{
    g->switched = 0;
    DSV4_TRY(dsv4_cu_status(cudaGetDevice(&g->prev), op));
    if (g->prev == ex->device) return DSV4_OK;
    int n = 0;
    DSV4_TRY(dsv4_cu_status(cudaGetDeviceCount(&n), op));
    if (ex->device < 0 || ex->device >= n)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: CUDA device %d does not exist (%d present)", op, ex->device, n);
    DSV4_TRY(dsv4_cu_status(cudaSetDevice(ex->device), op));
    g->switched = 1;
    return DSV4_OK;
}

void dsv4_cu_leave(dsv4_cu_guard *g)
{
    if (g->switched) cudaSetDevice(g->prev);
}

int dsv4_cu_sm_count(const dsv4_exec *ex)
{
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ex->device) != cudaSuccess || sms <= 0) {
        cudaGetLastError();
        sms = 132;
    }
    return sms;
}

static dsv4_status cuda_available(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "cuda: no usable CUDA device (%s: %s)", cudaGetErrorName(e),
                         cudaGetErrorString(e));
    }
    if (n == 0) return dsv4_fail(DSV4_ERR_UNSUPPORTED, "cuda: no CUDA device present");
    for (int d = 0; d < n; d++) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) == cudaSuccess && major >= 9)
            return DSV4_OK;
    }
    return dsv4_fail(DSV4_ERR_UNSUPPORTED, "cuda: the kernels need compute capability 9.0 (Hopper) or newer; "
                                           "none of the %d device(s) has it", n);
}

/* ---- memory ------------------------------------------------------------------------------ */
/* Run `call` on the context's device; its cudaError_t becomes the status. */
#define CU_RUN(ex, op, call)                                  \
    do {                                                      \
        dsv4_cu_guard g_;                                     \
        DSV4_TRY(dsv4_cu_enter((ex), (op), &g_));             \
        int e_ = (int)(call);                                 \
        dsv4_cu_leave(&g_);                                   \
        return dsv4_cu_status(e_, (op));                      \
    } while (0)

/* Device memory, or pinned host memory (`pinned`: the staging of dsv4_device_upload_async). */
static dsv4_status alloc_on(const dsv4_exec *ex, const char *op, int pinned, size_t bytes, void **ptr)
{
    dsv4_cu_guard g;
    DSV4_TRY(dsv4_cu_enter(ex, op, &g));
    cudaError_t e = pinned ? cudaMallocHost(ptr, bytes ? bytes : 1) : cudaMalloc(ptr, bytes ? bytes : 1);
    dsv4_cu_leave(&g);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return dsv4_fail(DSV4_ERR_NO_MEMORY, "%s: %zu bytes of %s memory not available", op, bytes,
                         pinned ? "pinned host" : "CUDA");
    }
    return dsv4_cu_status(e, op);
}

static dsv4_status mem_alloc(const dsv4_exec *ex, size_t bytes, void **ptr)
{
    return alloc_on(ex, "device_alloc", 0, bytes, ptr);
}

static dsv4_status mem_free(const dsv4_exec *ex, void *ptr) { CU_RUN(ex, "device_free", cudaFree(ptr)); }

static cudaError_t copy_sync(const dsv4_exec *ex, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind)
{
    cudaStream_t s = (cudaStream_t)dsv4_cu_stream(ex);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, s);
    return e != cudaSuccess ? e : cudaStreamSynchronize(s);
}

static dsv4_status mem_upload(const dsv4_exec *ex, void *dst, const void *src, size_t bytes)
{
    CU_RUN(ex, "device_upload", copy_sync(ex, dst, src, bytes, cudaMemcpyHostToDevice));
}

/* From pinned staging (dsv4_device_host_alloc): no wait, so that a graph can hold the copy. */
static dsv4_status mem_upload_async(const dsv4_exec *ex, void *dst, const void *src, size_t bytes)
{
    CU_RUN(ex, "device_upload_async",
           cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)dsv4_cu_stream(ex)));
}

static dsv4_status mem_host_alloc(const dsv4_exec *ex, size_t bytes, void **ptr)
{
    return alloc_on(ex, "device_host_alloc", 1, bytes, ptr);
}

static dsv4_status mem_host_free(const dsv4_exec *ex, void *ptr) { CU_RUN(ex, "device_host_free", cudaFreeHost(ptr)); }

static dsv4_status mem_download(const dsv4_exec *ex, void *dst, const void *src, size_t bytes)
{
    CU_RUN(ex, "device_download", copy_sync(ex, dst, src, bytes, cudaMemcpyDeviceToHost));
}

static dsv4_status mem_copy(const dsv4_exec *ex, void *dst, const void *src, size_t bytes)
{
    CU_RUN(ex, "device_copy",
           cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)dsv4_cu_stream(ex)));
}

static dsv4_status mem_memset(const dsv4_exec *ex, void *dst, int value, size_t bytes)
{
    CU_RUN(ex, "device_memset", cudaMemsetAsync(dst, value, bytes, (cudaStream_t)dsv4_cu_stream(ex)));
}

static dsv4_status mem_sync(const dsv4_exec *ex)
{
    CU_RUN(ex, "device_sync", cudaStreamSynchronize((cudaStream_t)dsv4_cu_stream(ex)));
}

static dsv4_status mem_info(const dsv4_exec *ex, dsv4_device_info *info)
{
    dsv4_cu_guard g;
    DSV4_TRY(dsv4_cu_enter(ex, "device_info", &g));
    struct cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, ex->device);
    size_t free_b = 0, total_b = 0;
    if (e == cudaSuccess) e = cudaMemGetInfo(&free_b, &total_b);
    dsv4_cu_leave(&g);
    DSV4_TRY(dsv4_cu_status(e, "device_info"));
    snprintf(info->name, sizeof info->name, "%.127s", prop.name);
    info->ordinal = ex->device;
    info->multiprocessors = prop.multiProcessorCount;
    info->compute_major = prop.major;
    info->compute_minor = prop.minor;
    info->total_memory = total_b;
    info->free_memory = free_b;
    info->l2_bytes = (size_t)prop.l2CacheSize;
    info->shared_per_block = prop.sharedMemPerBlockOptin;
    return DSV4_OK;
}

/* ---- timers and graphs ------------------------------------------------------------------- */
typedef struct cu_timer {
    cudaEvent_t ev[2];
} cu_timer;

static dsv4_status cu_timer_create(const dsv4_exec *ex, void **out)
{
    cu_timer *t = calloc(1, sizeof *t);
    if (!t) return dsv4_fail(DSV4_ERR_NO_MEMORY, "device_timer_create: out of memory");
    dsv4_cu_guard g;
    dsv4_status s = dsv4_cu_enter(ex, "device_timer_create", &g);
    if (s == DSV4_OK) {
        cudaError_t e = cudaEventCreate(&t->ev[0]);
        if (e == cudaSuccess) {
            e = cudaEventCreate(&t->ev[1]);
            if (e != cudaSuccess) cudaEventDestroy(t->ev[0]);
        }
        dsv4_cu_leave(&g);
        s = dsv4_cu_status(e, "device_timer_create");
    }
    if (s != DSV4_OK) {
        free(t);
        return s;
    }
    *out = t;
    return DSV4_OK;
}

static dsv4_status cu_timer_record(const dsv4_exec *ex, void *timer, int end)
{
    cu_timer *t = timer;
    CU_RUN(ex, "device_timer", cudaEventRecord(t->ev[end ? 1 : 0], (cudaStream_t)dsv4_cu_stream(ex)));
}

static cudaError_t elapsed(cu_timer *t, double *ms)
{
    float f = 0.0f;
    cudaError_t e = cudaEventSynchronize(t->ev[1]);
    if (e == cudaSuccess) e = cudaEventElapsedTime(&f, t->ev[0], t->ev[1]);
    *ms = f;
    return e;
}

static dsv4_status cu_timer_elapsed(const dsv4_exec *ex, void *timer, double *ms)
{
    CU_RUN(ex, "device_timer_elapsed_ms", elapsed(timer, ms));
}

static void cu_timer_destroy(void *timer)
{
    cu_timer *t = timer;
    cudaEventDestroy(t->ev[0]);
    cudaEventDestroy(t->ev[1]);
    free(t);
}

static dsv4_status cu_graph_begin(const dsv4_exec *ex)
{
    CU_RUN(ex, "device_graph_begin",
           cudaStreamBeginCapture((cudaStream_t)dsv4_cu_stream(ex), cudaStreamCaptureModeThreadLocal));
}

static cudaError_t cu_graph_finish(const dsv4_exec *ex, void **out)
{
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t e = cudaStreamEndCapture((cudaStream_t)dsv4_cu_stream(ex), &graph);
    if (e != cudaSuccess) return e;
    e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    *out = exec;
    return e;
}

static dsv4_status cu_graph_end(const dsv4_exec *ex, void **graph) { CU_RUN(ex, "device_graph_end", cu_graph_finish(ex, graph)); }

static dsv4_status cu_graph_launch(const dsv4_exec *ex, void *graph)
{
    CU_RUN(ex, "device_graph_launch", cudaGraphLaunch((cudaGraphExec_t)graph, (cudaStream_t)dsv4_cu_stream(ex)));
}

static void cu_graph_destroy(void *graph) { cudaGraphExecDestroy((cudaGraphExec_t)graph); }

/* A caller's cudaStream_t: one the runtime knows (cudaStreamQuery answers done or busy) and, where
 * the runtime can tell, of the context's device. */
static dsv4_status cu_stream_check(const dsv4_exec *ex, void *stream)
{
    dsv4_cu_guard g;
    DSV4_TRY(dsv4_cu_enter(ex, "device_stream_set", &g));
    cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
    int dev = ex->device;
#if CUDART_VERSION >= 12080
    if (e == cudaSuccess || e == cudaErrorNotReady) {
        cudaError_t d = cudaStreamGetDevice((cudaStream_t)stream, &dev);
        if (d != cudaSuccess) e = d;
    }
#endif
    dsv4_cu_leave(&g);
    if (e != cudaSuccess && e != cudaErrorNotReady) {
        cudaGetLastError();
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "device_stream_set: not a usable CUDA stream (%s)", cudaGetErrorString(e));
    }
    if (dev != ex->device)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "device_stream_set: the stream belongs to CUDA device %d, the context to %d",
                         dev, ex->device);
    return DSV4_OK;
}

static const struct dsv4_memory_ops cuda_memory_ops = {
    .alloc = mem_alloc,
    .free = mem_free,
    .upload = mem_upload,
    .download = mem_download,
    .copy = mem_copy,
    .memset = mem_memset,
    .sync = mem_sync,
    .info = mem_info,
    .host_alloc = mem_host_alloc,
    .host_free = mem_host_free,
    .upload_async = mem_upload_async,
    .timer_create = cu_timer_create,
    .timer_record = cu_timer_record,
    .timer_elapsed = cu_timer_elapsed,
    .timer_destroy = cu_timer_destroy,
    .stream_check = cu_stream_check,
    .graph_begin = cu_graph_begin,
    .graph_end = cu_graph_end,
    .graph_launch = cu_graph_launch,
    .graph_destroy = cu_graph_destroy,
};

const dsv4_backend dsv4_backend_cuda = {
    .name = "cuda",
    .device = DSV4_DEVICE_CUDA,
    .available = cuda_available,
    .configure = dsv4_cu_configure,
    .memory = &cuda_memory_ops,
    .formats = &dsv4_cuda_format_ops,
    .attention = &dsv4_cuda_attention_ops,
    .linear = &dsv4_cuda_linear_ops,
    .layer = &dsv4_cuda_layer_ops,
    .tensor = &dsv4_cuda_tensor_ops,
    .indexer = &dsv4_cuda_indexer_ops,
};
