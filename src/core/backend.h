/* The dispatch table. One dsv4_backend per backend, registered at start-up through the list the
 * build generates (dsv4_backend_list.inc); shared code reaches kernels only through it and never
 * names a backend. An op family is a struct of function pointers defined in its own header
 * (core/ops_<family>.h); a NULL family or entry means "this backend does not do it", which the
 * op layer turns into DSV4_ERR_UNSUPPORTED.
 *
 * Backend entry points receive raw pointers and sizes that the op layer (src/ops) has already
 * validated against the contract; they only check what depends on the backend. */
#ifndef DSV4_CORE_BACKEND_H
#define DSV4_CORE_BACKEND_H

#include "dsv4/formats.h"
#include "dsv4/tensor.h"

/* CPU instruction-set levels (core/cpu.c); cumulative. */
typedef enum dsv4_isa { DSV4_ISA_SCALAR = 0, DSV4_ISA_AVX2 = 1, DSV4_ISA_AVX512 = 2 } dsv4_isa;

/* How one call may run: CPU threads (and the context's pool of them, core/pool.h), device ordinal
 * and stream (accelerators), and the kernel choices fixed when the context was created (never
 * re-read on a call). */
typedef struct dsv4_exec {
    int threads;
    struct dsv4_pool *pool; /* threads - 1 workers (CPU backends; NULL: loops run on the caller) */
    int device;
    void *stream;
    dsv4_isa isa; /* level of the cpu backend's kernels: the best present, capped by the context */
    int variant;  /* the backend's own kernel choice, set by its configure hook (0: defaults) */
} dsv4_exec;

struct dsv4_format_ops;    /* core/ops_formats.h */
struct dsv4_attention_ops; /* core/ops_attention.h */
struct dsv4_linear_ops;    /* core/ops_linear.h */
struct dsv4_layer_ops;     /* core/ops_layer.h: norms, mHC, router, MoE */
struct dsv4_indexer_ops;   /* core/ops_indexer.h: compressor and lightning indexer */
struct dsv4_memory_ops;    /* core/ops_memory.h (device memory of accelerator backends) */
struct dsv4_tensor_ops;    /* core/ops_tensor.h: data movement (embedding rows, row copies, adds) */

typedef struct dsv4_backend {
    const char *name;
    dsv4_device_kind device;
    dsv4_status (*available)(void); /* NULL: always */
    /* Context creation: check the options this backend reads (or their environment defaults) and
     * record its choice in ex->variant; a bad option is an error with a message, a bad environment
     * value a warning on stderr. NULL: the backend has no options of its own. */
    dsv4_status (*configure)(const dsv4_ctx_options *options, dsv4_exec *ex);
    const struct dsv4_memory_ops *memory;
    const struct dsv4_format_ops *formats;
    const struct dsv4_attention_ops *attention;
    const struct dsv4_linear_ops *linear;
    const struct dsv4_layer_ops *layer;
    const struct dsv4_indexer_ops *indexer;
    const struct dsv4_tensor_ops *tensor;
} dsv4_backend;

/* ---- backends built as modules (core/module.c) ------------------------------------------------
 * A module (libdsv4-NAME.so, built from src/backends/NAME) exports one function,
 * DSV4_MODULE_ENTRY, which returns its backend or NULL (then *why says why). It is linked against
 * nothing of libdsv4: what it needs of the library comes in the host table, so that one module
 * serves libdsv4.so and every program linked with libdsv4.a. The versions must agree exactly
 * (the structs above are shared between the two sides). */
#define DSV4_MODULE_ENTRY "dsv4_module_backend"
typedef struct dsv4_module_host {
    const char *version; /* DSV4_VERSION_STRING of the library */
    size_t backend_size; /* sizeof(dsv4_backend) */
    dsv4_status (*fail)(dsv4_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
    void (*warn)(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
} dsv4_module_host;
typedef const dsv4_backend *(*dsv4_module_entry_fn)(const dsv4_module_host *host, char *why, size_t cap);

/* Load the module `file` (a name such as "libdsv4-cuda.so"), looked for in $DSV4_MODULE_DIR, then
 * beside the code of libdsv4 (libdsv4.so, or the program linked with libdsv4.a), then in the libdir
 * of that folder taken as a bindir (PREFIX/bin -> PREFIX/lib), then the configured install libdir.
 * NULL when it is absent or cannot load; *why says which, naming the paths. */
const dsv4_backend *dsv4_module_load(const char *file, char *why, size_t cap);

/* Registry and contexts (core/dispatch.c). */
const dsv4_backend *dsv4_backend_find(const char *name);
/* Resolve a (possibly NULL) context into its backend and execution settings. */
dsv4_status dsv4_ctx_resolve(const dsv4_ctx *ctx, const dsv4_backend **backend, dsv4_exec *exec);

/* The op families of dsv4_backend, for dsv4_op_resolve. */
typedef enum dsv4_op_family {
    DSV4_FAMILY_NONE = 0, /* no family needed (device memory, timers, graphs) */
    DSV4_FAMILY_FORMATS,
    DSV4_FAMILY_ATTENTION,
    DSV4_FAMILY_LINEAR,
    DSV4_FAMILY_LAYER,
    DSV4_FAMILY_INDEXER,
    DSV4_FAMILY_TENSOR,
} dsv4_op_family;

/* The preamble of every op: the backend and execution settings of a (possibly NULL) context,
 * failing with a message that names `op` when the default context cannot be made or the backend
 * lacks the op family (DSV4_ERR_UNSUPPORTED). */
dsv4_status dsv4_op_resolve(const dsv4_ctx *ctx, const char *op, dsv4_op_family family, const dsv4_backend **backend,
                            dsv4_exec *exec);
/* The start of an op function that has a `ctx` parameter: declares `op` (its name, for messages),
 * `b` and `ex` (the context's backend and execution settings) and returns dsv4_op_resolve's
 * failure for DSV4_FAMILY_<family> (DSV4_TRY: core/error.h). */
#define DSV4_OP_BEGIN(name, family)                                      \
    const char *op = name;                                               \
    const dsv4_backend *b;                                               \
    dsv4_exec ex;                                                        \
    DSV4_TRY(dsv4_op_resolve(ctx, op, DSV4_FAMILY_##family, &b, &ex));  \
    DSV4_OP_TIMER(op, b, &ex)

/* The op profile of DSV4_PROFILE_OPS (core/profile.c): DSV4_OP_BEGIN starts one, the end of the
 * op's scope ends it (a cleanup handler: every return path). op NULL: profiling is off. */
typedef struct dsv4_op_timer {
    const char *op;
    const dsv4_backend *b;
    dsv4_exec ex;
    double t0;
} dsv4_op_timer;
dsv4_op_timer dsv4_op_timer_begin(const char *op, const dsv4_backend *b, const dsv4_exec *ex);
void dsv4_op_timer_end(dsv4_op_timer *t);
/* For an op that resolves its backend itself: times the rest of the enclosing scope. */
#define DSV4_OP_TIMER(op, b, ex) \
    __attribute__((cleanup(dsv4_op_timer_end))) dsv4_op_timer op_timer_ = dsv4_op_timer_begin(op, b, ex)

/* The stream of the context's execution settings (checked by the caller; NULL: the default). */
dsv4_status dsv4_ctx_set_stream(dsv4_ctx *ctx, void *stream);

/* An entry of an op family; fails with a message naming the op and the backend. */
#define DSV4_BACKEND_ENTRY_CHECK(b, family, entry, op)                                            \
    (((b)->family && (b)->family->entry)                                                           \
         ? DSV4_OK                                                                                 \
         : dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: backend '%s' does not implement it", op, (b)->name))

/* CPU facts (core/cpu.c). */
/* Host memory: MemAvailable of /proc/meminfo (what can be had without swapping) in *available,
 * the physical memory in *total; 0 where unknown. */
void dsv4_host_memory(uint64_t *available, uint64_t *total);
/* The best level this machine has. */
dsv4_isa dsv4_cpu_isa_best(void);
/* The level a context runs: the best one, capped by `name` ("scalar", "avx2", "avx512"), or when
 * name is NULL by $DSV4_CPU_ISA (tests run every path on one machine that way). An unknown name
 * is DSV4_ERR_INVALID_ARG; an unknown $DSV4_CPU_ISA is a warning (dsv4_warn) and no cap. */
dsv4_status dsv4_cpu_isa_resolve(const char *name, dsv4_isa *out);
/* At a level: AVX-512 BF16 dot products (vdpbf16ps), AVX-512 VNNI present and allowed. */
int dsv4_cpu_isa_bf16(dsv4_isa isa);
int dsv4_cpu_isa_vnni(dsv4_isa isa);
/* The name of a level as dsv4_cpu_isa() reports it ("avx512+bf16", "avx512", "avx2", "scalar"). */
const char *dsv4_cpu_isa_name(dsv4_isa isa);

#endif
