/* The tensor family of the cuda backend (core/ops_tensor.h). The add, the sampling
 * (sample_cuda.cu) and embed_rows launch and return: embed_rows is a step's first op, so it reads
 * its ids on the device only (graph-capturable), an id out of range giving a row of zeros
 * (include/dsv4/tensor_ops.h; the engine checks its tokens on the host first). copy_rows with an
 * index must reject an entry out of range before writing anything, and the entries are in device
 * memory: they are read back first (in pieces of 1024 through a stack buffer, a wait on the
 * context's stream each), so it cannot be captured in a CUDA graph. */
#include "backends/cuda/cuda_glue.h"
#include "backends/cuda/cuda_ops.h"
#include "core/error.h"
#include "core/ops_tensor.h"

#include <cuda_runtime_api.h>

/* Every idx[i*s], i < n, in [0, bound), read from the device. */
static dsv4_status check_index(const dsv4_exec *ex, const char *op, const char *name, const int32_t *idx, int64_t s,
                               int64_t n, int64_t bound)
{
    enum { PIECE = 1024 };
    int32_t buf[PIECE];
    cudaStream_t st = (cudaStream_t)dsv4_cu_stream(ex);
    for (int64_t i0 = 0; i0 < n; i0 += PIECE) {
        const int64_t c = n - i0 < PIECE ? n - i0 : PIECE;
        cudaError_t e = s == 1 ? cudaMemcpyAsync(buf, idx + i0, (size_t)c * 4, cudaMemcpyDeviceToHost, st)
                               : cudaMemcpy2DAsync(buf, 4, idx + i0 * s, (size_t)s * 4, 4, (size_t)c,
                                                   cudaMemcpyDeviceToHost, st);
        if (e == cudaSuccess) e = cudaStreamSynchronize(st);
        DSV4_TRY(dsv4_cu_status((int)e, op));
        for (int64_t i = 0; i < c; i++)
            if (buf[i] < 0 || buf[i] >= bound)
                return dsv4_fail(DSV4_ERR_RANGE, "%s: %s[%lld] = %d is outside [0, %lld)", op, name,
                                 (long long)(i0 + i), buf[i], (long long)bound);
    }
    return DSV4_OK;
}

static dsv4_status cu_embed(const dsv4_exec *ex, const dsv4_embed_args *a)
{
    CU_LAUNCH(ex, "embed_rows",
              dsv4_cu_embed_launch(a->table, a->ldt, a->V, a->D, a->ids, a->ids_s, a->T, a->out, a->so_t, a->so_j,
                                   a->copies, dsv4_cu_stream(ex)));
}

static dsv4_status cu_add(const dsv4_exec *ex, const dsv4_add_args *a)
{
    CU_LAUNCH(ex, "add_bf16",
              dsv4_cu_add_bf16_launch(a->T, a->n, a->D, a->a, a->sa_t, a->sa_j, a->b, a->sb_t, a->y, a->sy_t, a->sy_j,
                                      dsv4_cu_stream(ex)));
}

static dsv4_status cu_copy(const dsv4_exec *ex, const dsv4_copy_rows_args *a)
{
    dsv4_cu_guard g;
    DSV4_TRY(dsv4_cu_enter(ex, "copy_rows", &g));
    dsv4_status s = a->idx ? check_index(ex, "copy_rows", "idx", a->idx, a->idx_s, a->n, a->R) : DSV4_OK;
    int e = s || (!a->idx && a->src == a->dst && a->lds == a->ldd)
                ? 0
                : dsv4_cu_copy_rows_launch(a->src, a->lds, a->idx, a->idx_s, a->dst, a->ldd, a->n, a->row_bytes,
                                           dsv4_cu_stream(ex));
    dsv4_cu_leave(&g);
    DSV4_TRY(s);
    return dsv4_cu_status(e, "copy_rows");
}

/* sample_cuda.cu: one launch, parameters and states read on the device, refused rows as codes. */
static dsv4_status cu_sample(const dsv4_exec *ex, const dsv4_sample_args *a)
{
    CU_LAUNCH(ex, "sample_rows",
              dsv4_cu_sample_launch(a->logits, a->ldl, a->B, a->V, a->params, a->rng, a->tokens, a->tok_s, a->ws,
                                    a->ws_row, dsv4_cu_stream(ex)));
}

/* One launch; the entries are the device's (dsv4_paged_slots: out of the table means no entry). */
static dsv4_status cu_paged_slots(const dsv4_exec *ex, const dsv4_paged_slots_args *a)
{
    CU_LAUNCH(ex, "paged_slots",
              dsv4_cu_paged_slots_launch(a->table, a->n_blocks, a->block_size, a->entries, a->es, a->slots, a->ss, a->n,
                                         dsv4_cu_stream(ex)));
}

const struct dsv4_tensor_ops dsv4_cuda_tensor_ops = {cu_embed, cu_add, cu_copy, cu_sample, cu_paged_slots};
