/* Device memory: buffers in the memory of a context's backend (GPU memory for "cuda", host
 * memory for the CPU backends), so that tensors, KV cache pages and workspaces can live where
 * the kernels run. A tensor view of such a buffer carries the context's device kind
 * (dsv4_ctx_device_kind); ops check that every tensor is in their backend's memory.
 *
 * Work on a device is ordered on the context's stream. Uploads and downloads return when the
 * bytes have arrived; device copies, memsets and kernels are asynchronous on the stream and
 * dsv4_device_sync waits for them. On a CPU backend everything is synchronous host memory. */
#ifndef DSV4_DEVICE_H
#define DSV4_DEVICE_H

#include "core.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_device_info {
    char name[128];
    int ordinal;
    int multiprocessors;     /* SMs (GPU) or cores (CPU) */
    int compute_major, compute_minor; /* 0 on the CPU */
    size_t total_memory;     /* bytes (0 when unknown) */
    size_t free_memory;
    size_t l2_bytes;
    size_t shared_per_block; /* opt-in shared memory per block (GPU) */
} dsv4_device_info;

/* Kind of memory the context's backend computes on (DSV4_DEVICE_CPU or DSV4_DEVICE_CUDA). */
DSV4_API dsv4_device_kind dsv4_ctx_device_kind(dsv4_ctx *ctx);
DSV4_API dsv4_status dsv4_device_info_get(dsv4_ctx *ctx, dsv4_device_info *info);

/* Raw buffers (256-byte aligned). free(NULL) is a no-op. */
DSV4_API dsv4_status dsv4_device_alloc(dsv4_ctx *ctx, size_t bytes, void **ptr);
DSV4_API dsv4_status dsv4_device_free(dsv4_ctx *ctx, void *ptr);
DSV4_API dsv4_status dsv4_device_upload(dsv4_ctx *ctx, void *dst, const void *src, size_t bytes);
DSV4_API dsv4_status dsv4_device_download(dsv4_ctx *ctx, void *dst, const void *src, size_t bytes);
DSV4_API dsv4_status dsv4_device_copy(dsv4_ctx *ctx, void *dst, const void *src, size_t bytes);
DSV4_API dsv4_status dsv4_device_memset(dsv4_ctx *ctx, void *dst, int value, size_t bytes);
DSV4_API dsv4_status dsv4_device_sync(dsv4_ctx *ctx);

/* Staging memory on the host for asynchronous uploads: page-locked (pinned) host memory on a
 * device, plain host memory on a CPU backend. host_free(NULL) is a no-op. */
DSV4_API dsv4_status dsv4_device_host_alloc(dsv4_ctx *ctx, size_t bytes, void **ptr);
DSV4_API dsv4_status dsv4_device_host_free(dsv4_ctx *ctx, void *ptr);
/* An upload ordered on the context's stream that returns at once (a host copy on a CPU backend):
 * src must be memory of dsv4_device_host_alloc and keep its bytes until the stream reaches the
 * copy (dsv4_device_sync, or a download after it). It can be recorded in a graph: each launch
 * then copies what src holds when the stream reaches it. */
DSV4_API dsv4_status dsv4_device_upload_async(dsv4_ctx *ctx, void *dst, const void *src, size_t bytes);

/* A contiguous tensor in device memory (t->data owned by the caller: dsv4_device_tensor_free). */
DSV4_API dsv4_status dsv4_device_tensor_alloc(dsv4_ctx *ctx, dsv4_tensor *t, dsv4_dtype dtype, int ndim,
                                              const int64_t *shape);
DSV4_API dsv4_status dsv4_device_tensor_free(dsv4_ctx *ctx, dsv4_tensor *t);

/* The stream the context's work is ordered on, for embedding dsv4 in a program with its own CUDA
 * work: a cudaStream_t of the context's device (cast to void *), or NULL for the backend's
 * default (CUDA's per-thread default stream). The caller keeps the stream alive while the
 * context uses it; timers and graphs keep the stream they were created on. Only contexts made
 * with dsv4_ctx_create (the default context keeps its stream). A CPU backend accepts only NULL
 * (DSV4_ERR_UNSUPPORTED otherwise); a handle the CUDA runtime does not know, or one of another
 * device, is DSV4_ERR_INVALID_ARG and leaves the context as it was. */
DSV4_API dsv4_status dsv4_device_stream_set(dsv4_ctx *ctx, void *stream);
DSV4_API dsv4_status dsv4_device_stream_get(dsv4_ctx *ctx, void **stream);

/* Device-side timing: start/stop are recorded on the stream; elapsed waits for the stop. */
typedef struct dsv4_device_timer dsv4_device_timer;
DSV4_API dsv4_status dsv4_device_timer_create(dsv4_ctx *ctx, dsv4_device_timer **timer);
DSV4_API dsv4_status dsv4_device_timer_start(dsv4_device_timer *timer);
DSV4_API dsv4_status dsv4_device_timer_stop(dsv4_device_timer *timer);
DSV4_API dsv4_status dsv4_device_timer_elapsed_ms(dsv4_device_timer *timer, double *ms);
DSV4_API void dsv4_device_timer_destroy(dsv4_device_timer *timer);

/* Graphs: the ops issued on the context between begin and end are recorded (not run) and can be
 * replayed with launch. DSV4_ERR_UNSUPPORTED on backends without graphs. */
typedef struct dsv4_device_graph dsv4_device_graph;
DSV4_API dsv4_status dsv4_device_graph_begin(dsv4_ctx *ctx);
DSV4_API dsv4_status dsv4_device_graph_end(dsv4_ctx *ctx, dsv4_device_graph **graph);
DSV4_API dsv4_status dsv4_device_graph_launch(dsv4_device_graph *graph);
DSV4_API void dsv4_device_graph_destroy(dsv4_device_graph *graph);

#ifdef __cplusplus
}
#endif
#endif
