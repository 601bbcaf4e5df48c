/* Memory family: the device memory of an accelerator backend (include/dsv4/device.h is the
 * public side). A backend whose tensors live in host memory leaves its `memory` table NULL and
 * the runtime (src/runtime/device.c) serves the calls from host memory instead.
 *
 * All work is ordered on the stream of the execution settings (ex->stream; NULL = the backend's
 * default stream of ex->device). upload/download return when the bytes have arrived; copy,
 * memset and kernels are asynchronous on that stream; sync waits for all of it. */
#ifndef DSV4_CORE_OPS_MEMORY_H
#define DSV4_CORE_OPS_MEMORY_H

#include "core/backend.h"
#include "dsv4/device.h"

struct dsv4_memory_ops {
    dsv4_status (*alloc)(const dsv4_exec *ex, size_t bytes, void **ptr);
    dsv4_status (*free)(const dsv4_exec *ex, void *ptr);
    dsv4_status (*upload)(const dsv4_exec *ex, void *dst, const void *src, size_t bytes);
    dsv4_status (*download)(const dsv4_exec *ex, void *dst, const void *src, size_t bytes);
    dsv4_status (*copy)(const dsv4_exec *ex, void *dst, const void *src, size_t bytes);
    dsv4_status (*memset)(const dsv4_exec *ex, void *dst, int value, size_t bytes);
    dsv4_status (*sync)(const dsv4_exec *ex);
    dsv4_status (*info)(const dsv4_exec *ex, dsv4_device_info *info);
    /* Pinned host staging and the upload from it that does not wait (include/dsv4/device.h). */
    dsv4_status (*host_alloc)(const dsv4_exec *ex, size_t bytes, void **ptr);
    dsv4_status (*host_free)(const dsv4_exec *ex, void *ptr);
    dsv4_status (*upload_async)(const dsv4_exec *ex, void *dst, const void *src, size_t bytes);

    /* Timing of device work: an event pair recorded on the stream. */
    dsv4_status (*timer_create)(const dsv4_exec *ex, void **timer);
    dsv4_status (*timer_record)(const dsv4_exec *ex, void *timer, int end); /* end 0: start, 1: stop */
    dsv4_status (*timer_elapsed)(const dsv4_exec *ex, void *timer, double *ms);
    void (*timer_destroy)(void *timer);

    /* Whether `stream` (a backend handle, not NULL) can order the context's work. */
    dsv4_status (*stream_check)(const dsv4_exec *ex, void *stream);

    /* Graph capture of the work issued on the stream between begin and end. */
    dsv4_status (*graph_begin)(const dsv4_exec *ex);
    dsv4_status (*graph_end)(const dsv4_exec *ex, void **graph);
    dsv4_status (*graph_launch)(const dsv4_exec *ex, void *graph);
    void (*graph_destroy)(void *graph);
};

#endif
