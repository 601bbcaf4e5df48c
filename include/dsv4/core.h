/* Status codes, error messages, execution contexts and backend selection. */
#ifndef DSV4_CORE_H
#define DSV4_CORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DSV4_API __attribute__((visibility("default")))
#else
#define DSV4_API
#endif

typedef enum dsv4_status {
    DSV4_OK = 0,
    DSV4_ERR_INVALID_ARG = 1, /* null pointer, bad enum, bad option */
    DSV4_ERR_SHAPE = 2,       /* shapes disagree with the contract */
    DSV4_ERR_DTYPE = 3,       /* wrong element type */
    DSV4_ERR_STRIDE = 4,      /* layout the kernel cannot consume (strides, alignment) */
    DSV4_ERR_RANGE = 5,       /* index or value out of its allowed range */
    DSV4_ERR_NO_MEMORY = 6,   /* allocation failed (never inside a hot path) */
    DSV4_ERR_CAPACITY = 7,    /* a fixed-size pool (e.g. KV pages) is exhausted */
    DSV4_ERR_IO = 8,          /* file cannot be opened / read / mapped */
    DSV4_ERR_FORMAT = 9,      /* malformed or hostile file contents */
    DSV4_ERR_UNSUPPORTED = 10,/* valid request the selected backend / build cannot do */
    DSV4_ERR_BACKEND = 11,    /* the backend (e.g. the CUDA runtime) reported a failure */
    DSV4_ERR_NOT_FOUND = 12   /* named thing (backend, tensor, file) does not exist */
} dsv4_status;

/* Message of the last failure on this thread ("" if none). Valid until the next failing call. */
DSV4_API const char *dsv4_last_error(void);
DSV4_API const char *dsv4_status_name(dsv4_status status);
DSV4_API void dsv4_clear_error(void);
DSV4_API const char *dsv4_version(void);

/* ---- warnings ------------------------------------------------------------------------------
 * What does not fail a call but should not pass unheard (a config key the library does not know,
 * an environment value it ignores, a memory plan that takes most of the machine, a context longer
 * than the model was trained for) goes to one process-wide handler, as one line without a newline.
 * The default handler, dsv4_warning_stderr, prints each distinct message once per process as
 * "dsv4: warning: MESSAGE". dsv4_set_warning_handler(NULL, NULL) silences every warning; a
 * caller's handler receives them all (from whichever thread made the call: it must be
 * thread-safe and must not call dsv4_set_warning_handler). The handler is process-wide rather than
 * a context option because config parsing and the tokenizer take no context. */
typedef void (*dsv4_warning_fn)(void *user, const char *message);
DSV4_API void dsv4_set_warning_handler(dsv4_warning_fn fn, void *user);
DSV4_API void dsv4_warning_stderr(void *user, const char *message);

/* ---- execution context -------------------------------------------------------------------
 * A context names the backend that runs the ops, how many CPU threads they may use and which
 * kernels run. Passing NULL as a context means the default one: backend from $DSV4_BACKEND (else
 * "cpu"), threads from $DSV4_THREADS (else all cores), kernel choices from their environment
 * variables. Every option is read once, when the context is created. Results never depend on the
 * thread count. A zero-initialized dsv4_ctx_options asks for every default. */
typedef struct dsv4_ctx dsv4_ctx;

/* The most CPU threads a context takes. Per-thread buffers (the indexer's top-k lists) are planned
 * for every thread, so an absurd count would plan absurd memory: an option above it is refused, a
 * $DSV4_THREADS outside [1, DSV4_MAX_THREADS] (or not a plain decimal number) is ignored with a
 * warning. */
#define DSV4_MAX_THREADS 1024

typedef struct dsv4_ctx_options {
    const char *backend; /* NULL: $DSV4_BACKEND or "cpu" */
    int threads;         /* 0: $DSV4_THREADS or all cores; at most DSV4_MAX_THREADS (more is refused) */
    int device;          /* device ordinal for accelerator backends */
    /* cpu backend: cap its kernels at "scalar", "avx2" or "avx512" (a cap only: a machine without
     * the ISA runs a lower one). NULL: $DSV4_CPU_ISA, else the best present. */
    const char *cpu_isa;
    /* cuda backend: the decode kernel for 64-head tiles of FP8 pages, "auto" (ws2, or v1 where a
     * CTA gets one block of entries), "ws2", "ws1", "v1" or "mma-sync" (the mma.sync kernels
     * instead of the warpgroup-MMA ones, BF16 rows too), optionally followed by ",no-pair" (the two
     * 64-head tiles of H 128 in separate CTAs), ",no-split" (one CTA per query and head tile:
     * no combine kernel, whatever the split plan), ",split2" (queries of two 64-entry blocks split
     * in two wherever the grid allows), ",no-pdl" (the decode launched plainly instead of as
     * a programmatic dependent of the kernel before it) or ",pdl" (always so; by default a rule
     * decides), and, to time them against the defaults, ",seq-combine" (one combine kernel
     * whatever the split count) and ",late-release" (the decode lets the launch after it start
     * after its loop instead of first); none of these three changes a result. NULL: $DSV4_CUDA_DECODE, $DSV4_CUDA_MMA_SYNC=1
     * and $DSV4_CUDA_NO_PAIR=1, else "auto". Other backends ignore it. */
    const char *cuda_decode;
} dsv4_ctx_options;

DSV4_API dsv4_status dsv4_ctx_create(const dsv4_ctx_options *options, dsv4_ctx **out);
DSV4_API void dsv4_ctx_destroy(dsv4_ctx *ctx);
DSV4_API const char *dsv4_ctx_backend_name(const dsv4_ctx *ctx);
DSV4_API int dsv4_ctx_threads(const dsv4_ctx *ctx);
/* The kernels a context's cpu backend runs, named as dsv4_cpu_isa() names them. */
DSV4_API const char *dsv4_ctx_cpu_isa(const dsv4_ctx *ctx);
/* What a CPU context's thread pool did since the context was created (docs/kernels.md §11.1), for
 * benchmarks: loops run by the team and by the caller alone and their time, stalls (a worker held the caller
 * back) and the ns they cost, the times the team shrank because another process had its cores,
 * the probes with one thread more, and the team's size now. Zeros (team 1) for a context without
 * a pool; call it while no op runs on the context. */
enum {
    DSV4_POOL_LOOPS_TEAM,
    DSV4_POOL_LOOPS_ALONE,
    DSV4_POOL_TEAM_NS,  /* the time the caller spent in loops of the team */
    DSV4_POOL_ALONE_NS, /* and in loops alone */
    DSV4_POOL_STALLS,
    DSV4_POOL_STALL_NS,
    DSV4_POOL_SHRINKS,
    DSV4_POOL_PROBES,
    DSV4_POOL_TEAM,
    DSV4_POOL_COUNTS
};
DSV4_API void dsv4_ctx_pool_counts(const dsv4_ctx *ctx, int64_t out[DSV4_POOL_COUNTS]);

/* Registered backends, in registration order ("cpu", "cpu-ref", and "cuda" when built with it). */
DSV4_API int dsv4_backend_count(void);
DSV4_API const char *dsv4_backend_name(int index);
/* DSV4_OK if the backend can run here (e.g. a CUDA device is present), else why not. */
DSV4_API dsv4_status dsv4_backend_available(const char *name);

/* ---- struct layout -----------------------------------------------------------------------
 * The public structs as this library was compiled, for bindings that mirror them (the Python
 * binding checks its ctypes structures at import): the size and field count of struct `name`
 * (its C type name, e.g. "dsv4_tensor"), and field `index` (declaration order): name, offset and
 * size. DSV4_ERR_NOT_FOUND for a name the table lacks, DSV4_ERR_RANGE for an index past the end. */
DSV4_API dsv4_status dsv4_abi_struct(const char *name, size_t *size, int *n_fields);
DSV4_API dsv4_status dsv4_abi_field(const char *name, int index, const char **field, size_t *offset, size_t *size);

/* CPU facts for `dsv4 info`: the instruction sets found, and the kernels the cpu backend of a
 * context created now would run ("avx512+bf16", "avx512", "avx2" or "scalar"; $DSV4_CPU_ISA read
 * at this call). */
DSV4_API const char *dsv4_cpu_features(void);
DSV4_API const char *dsv4_cpu_isa(void);
DSV4_API int dsv4_default_threads(void);

#ifdef __cplusplus
}
#endif
#endif
