/* Host-side helpers of the CUDA backend (C): the stream of an execution setting, a scoped switch
 * to its device that restores the caller's current device, and CUDA errors -> dsv4 errors. */
#ifndef DSV4_CUDA_GLUE_H
#define DSV4_CUDA_GLUE_H

#include "core/backend.h"
#include "dsv4/layer.h"

/* ex->stream, or the per-thread default stream of the device when NULL. */
void *dsv4_cu_stream(const dsv4_exec *ex);

typedef struct dsv4_cu_scope_guard {
    int prev;
    int switched;
} dsv4_cu_guard;

/* Make ex->device current (checked: it must exist); dsv4_cu_leave restores the previous one. */
dsv4_status dsv4_cu_enter(const dsv4_exec *ex, const char *op, dsv4_cu_guard *g);
void dsv4_cu_leave(dsv4_cu_guard *g);
/* err (a cudaError_t) -> DSV4_OK or DSV4_ERR_BACKEND naming the op and the CUDA error. */
dsv4_status dsv4_cu_status(int err, const char *op);
/* The backend's configure hook (cuda_options.c): dsv4_ctx_options.cuda_decode, or its environment
 * defaults, into ex->variant. */
dsv4_status dsv4_cu_configure(const dsv4_ctx_options *o, dsv4_exec *ex);
/* In a function returning dsv4_status: enter ex's device, run `call` (a launcher's cudaError_t as
 * int), leave, and return it as a status naming `op`. */
#define CU_LAUNCH(ex, op, call)                   \
    do {                                          \
        dsv4_cu_guard g_;                         \
        DSV4_TRY(dsv4_cu_enter((ex), (op), &g_)); \
        int e_ = (call);                          \
        dsv4_cu_leave(&g_);                       \
        return dsv4_cu_status(e_, (op));          \
    } while (0)

/* Multiprocessors of ex->device (132 on an H200; a guess when the query fails). */
int dsv4_cu_sm_count(const dsv4_exec *ex);

/* The routed experts' product `which` (0: w1, 1: w3, 2: w2) of the MoE block on its sorted rows
 * (linear_cuda.c): y [R, n] (BF16) = x [R, k] (BF16, contiguous) times expert e's weight on e's
 * rows [offsets[e], offsets[e+1]) (device memory), for every e < E; with y3 (which 0) also
 * y3 = x times w3, in the same launch. Quantized formats stage x into ws when `stage`. */
dsv4_status dsv4_cu_moe_product(const dsv4_exec *ex, const dsv4_ffn_weights *experts, int E, int which,
                                const int32_t *offsets, const uint16_t *x, int64_t R, int64_t k,
                                uint16_t *y, uint16_t *y3, int64_t n, void *ws, int stage);
/* The plain product a (groups 1, no bias) and the same x times w3 (scale s3) into y3 (a's
 * strides), on one staging of x (linear_cuda.c): the shared expert's w1 and w3. */
struct dsv4_linear_args;
dsv4_status dsv4_cu_linear_pair(const dsv4_exec *ex, const struct dsv4_linear_args *a, const dsv4_tensor *w3,
                                const dsv4_tensor *s3, void *y3);
/* The plain product a (quantized formats, groups 1, no bias) on the staging of its x that the
 * launch before wrote into a->workspace (dsv4_cu_stage_*_launch; nothing checks it, linear_cuda.c). */
dsv4_status dsv4_cu_linear_prestaged(const dsv4_exec *ex, const struct dsv4_linear_args *a);
/* The MoE block (moe_cuda.c). */
struct dsv4_moe_args;
dsv4_status dsv4_cu_moe(const dsv4_exec *ex, const struct dsv4_moe_args *a);

extern const struct dsv4_attention_ops dsv4_cuda_attention_ops;
extern const struct dsv4_format_ops dsv4_cuda_format_ops; /* formats_cuda.c */
extern const struct dsv4_linear_ops dsv4_cuda_linear_ops; /* linear_cuda.c */
extern const struct dsv4_layer_ops dsv4_cuda_layer_ops;   /* layer_cuda.c */
extern const struct dsv4_tensor_ops dsv4_cuda_tensor_ops; /* tensor_cuda.c */
extern const struct dsv4_indexer_ops dsv4_cuda_indexer_ops; /* indexer_cuda.c */

#endif
