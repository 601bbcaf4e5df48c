/* The linear family of the cuda backend (core/ops_linear.h): the work space layout, argument
 * translation and the launches of linear_cuda.cu on the context's stream. A plain product
 * allocates nothing, never synchronizes and reads no device data, so it can be captured in a CUDA
 * graph. A staged product (dsv4_linear_staged) must check the staging's description before it
 * writes y, and that description lives in device memory: it is read back first (64 bytes and a
 * wait on the stream), so staged products cannot be captured; a device step runs
 * dsv4_linear instead, which stages inside the same launch sequence. */
#include "backends/cuda/cuda_glue.h"
#include "backends/cuda/cuda_ops.h"
#include "core/error.h"
#include "core/ops_linear.h"

#include <cuda_runtime_api.h>

static int quantized(dsv4_linear_format fmt) { return fmt <= DSV4_LINEAR_FP4; }
static int mx32(dsv4_linear_format fmt) { return fmt == DSV4_LINEAR_MXFP8; }

/* 64 bytes to reach a 64-byte boundary, then the staging (cuda_ops.h: the description, the BF16
 * rows, the FP16 codes and the scales). */
static size_t workspace_size(dsv4_linear_format fmt, int64_t rows, int64_t k)
{
    return quantized(fmt) ? 64 + (size_t)dsv4_cu_stage_bytes(rows, k) : 0;
}

static dsv4_cu_stage_head *head_of(void *ws) { return (dsv4_cu_stage_head *)(((uintptr_t)ws + 63) & ~(uintptr_t)63); }

/* x of a quantized product: the staging of `rows` rows of K = l->k in the work space. */
static void use_staging(dsv4_cu_linear *l, dsv4_cu_stage_head *h, int64_t rows)
{
    l->x = h + 1;
    l->x_bf16 = 1;
    l->xs_m = l->groups * l->k;
    l->xs_g = l->k;
    if (l->k % 32 == 0) {
        l->xcodes = (const uint16_t *)((const uint8_t *)h + dsv4_cu_stage_codes_offset(rows, l->k));
        l->xscales = (const float *)((const uint8_t *)h + dsv4_cu_stage_scales_offset(rows, l->k));
    }
}

static size_t elem_bytes(dsv4_linear_format fmt)
{
    return fmt == DSV4_LINEAR_F32 ? 4 : fmt == DSV4_LINEAR_BF16 ? 2 : 1;
}

/* The description the staged call checks, read from the device (docs above). */
static dsv4_status check_staging(const dsv4_exec *ex, const dsv4_linear_args *a)
{
    const char *op = "linear_staged";
    dsv4_cu_stage_head h;
    cudaStream_t s = (cudaStream_t)dsv4_cu_stream(ex);
    cudaError_t e = cudaMemcpyAsync(&h, head_of(a->workspace), sizeof h, cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    DSV4_TRY(dsv4_cu_status((int)e, op));
    if (h.magic != DSV4_CU_STAGE_MAGIC)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: the work space holds no staging (dsv4_linear_stage)", op);
    if (h.mx32 != mx32(a->fmt))
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: activations staged with %s cannot feed %s weights (%s)", op,
                         h.mx32 ? "mx32" : "act128", dsv4_linear_fmt_str(a->fmt), mx32(a->fmt) ? "mx32" : "act128");
    if (h.rows != a->m || h.k != a->k)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: the staging holds %lld rows of K = %lld; x is [%lld, %lld]", op,
                         h.rows, h.k, (long long)a->m, (long long)a->k);
    return DSV4_OK;
}

static dsv4_status cu_linear(const dsv4_exec *ex, const dsv4_linear_args *a)
{
    const char *op = a->staged ? "linear_staged" : a->groups > 1 ? "grouped_linear" : "linear";
    dsv4_cu_guard g;
    DSV4_TRY(dsv4_cu_enter(ex, op, &g));
    void *s = dsv4_cu_stream(ex);
    dsv4_cu_linear l = {
        .fmt = (int)a->fmt, .groups = a->groups, .m = a->m, .n = a->n, .k = a->k,
        .x = a->x, .x_bf16 = a->x_bf16, .xs_m = a->xs_m, .xs_g = a->xs_g,
        .w = a->w, .ws_r_bytes = a->ws_r * (int64_t)elem_bytes(a->fmt),
        .scale = a->scale, .ss0 = a->ss0, .ss1 = a->ss1,
        .bias = a->bias, .bias_bf16 = a->bias_bf16, .bias_s = a->bias_s,
        .y = a->y, .y_bf16 = a->y_bf16, .ys_m = a->ys_m, .ys_g = a->ys_g,
    };
    dsv4_status st = DSV4_OK;
    int e = 0;
    if (quantized(a->fmt)) {
        dsv4_cu_stage_head *h = head_of(a->workspace);
        if (a->staged)
            st = check_staging(ex, a);
        else if (a->m)
            e = dsv4_cu_stage_launch(a->x, a->x_bf16, a->xs_m, a->xs_g, a->m, a->groups, a->k, mx32(a->fmt), h, s);
        use_staging(&l, h, a->m * a->groups);
    }
    if (st == DSV4_OK && e == 0) e = dsv4_cu_linear_launch(&l, s);
    dsv4_cu_leave(&g);
    DSV4_TRY(st);
    return dsv4_cu_status(e, op);
}

static dsv4_status cu_stage(const dsv4_exec *ex, const dsv4_linear_args *a)
{
    dsv4_cu_guard g;
    DSV4_TRY(dsv4_cu_enter(ex, "linear_stage", &g));
    int e = dsv4_cu_stage_launch(a->x, a->x_bf16, a->xs_m, 0, a->m, 1, a->k, mx32(a->fmt), head_of(a->workspace),
                                 dsv4_cu_stream(ex));
    dsv4_cu_leave(&g);
    return dsv4_cu_status(e, "linear_stage");
}

static const dsv4_tensor *expert_weight(const dsv4_ffn_weights *f, int which, const dsv4_tensor **scale)
{
    *scale = which == 0 ? f->w1_scale : which == 1 ? f->w3_scale : f->w2_scale;
    return which == 0 ? f->w1 : which == 1 ? f->w3 : f->w2;
}

dsv4_status dsv4_cu_moe_product(const dsv4_exec *ex, const dsv4_ffn_weights *experts, int E, int which,
                                const int32_t *offsets, const uint16_t *x, int64_t R, int64_t k,
                                uint16_t *y, uint16_t *y3, int64_t n, void *ws, int stage)
{
    const char *op = "moe";
    const dsv4_linear_format fmt = experts[0].fmt;
    const dsv4_tensor *s0, *w0 = expert_weight(&experts[0], which, &s0);
    dsv4_cu_linear l = {
        .fmt = (int)fmt, .groups = 1, .m = R, .n = n, .k = k, .x = x, .x_bf16 = 1, .xs_m = k,
        .ws_r_bytes = w0->stride[0] * (int64_t)elem_bytes(fmt), .ss0 = s0 ? s0->stride[0] : 0,
        .ss1 = s0 ? s0->stride[1] : 0, .y_bf16 = 1, .ys_m = n,
    };
    void *st = dsv4_cu_stream(ex);
    int e = 0;
    if (quantized(fmt)) {
        dsv4_cu_stage_head *h = head_of(ws);
        if (stage) e = dsv4_cu_stage_launch(x, 1, k, 0, R, 1, k, mx32(fmt), h, st);
        use_staging(&l, h, R);
    }
    dsv4_cu_moe_chunk c; /* 8 KB */
    c.offsets = offsets;
    c.sets = y3 ? 2 : 1;
    c.y[0] = y, c.y[1] = y3;
    for (int e0 = 0; e == 0 && e0 < E; e0 += DSV4_CU_MOE_CHUNK) {
        c.e0 = e0;
        c.n = E - e0 < DSV4_CU_MOE_CHUNK ? E - e0 : DSV4_CU_MOE_CHUNK;
        for (int j = 0; j < c.sets; j++)
            for (int i = 0; i < c.n; i++) {
                const dsv4_tensor *si, *wi = expert_weight(&experts[e0 + i], which + j, &si);
                if (wi->stride[0] != w0->stride[0] || (si && si->stride[0] != s0->stride[0]))
                    return dsv4_fail(DSV4_ERR_UNSUPPORTED,
                                     "%s: expert %d's weights have other row strides than expert 0's (the cuda kernel "
                                     "takes one layout)", op, e0 + i);
                c.w[j][i] = wi->data;
                c.s[j][i] = si ? si->data : NULL;
            }
        e = dsv4_cu_moe_linear_launch(&l, &c, st);
    }
    return dsv4_cu_status(e, op);
}

dsv4_status dsv4_cu_linear_pair(const dsv4_exec *ex, const dsv4_linear_args *a, const dsv4_tensor *w3,
                                const dsv4_tensor *s3, void *y3)
{
    const char *op = "linear";
    if (!quantized(a->fmt)) {
        dsv4_linear_args b = *a;
        b.w = w3->data, b.scale = s3 ? s3->data : NULL, b.y = y3;
        DSV4_TRY(cu_linear(ex, a));
        return cu_linear(ex, &b);
    }
    dsv4_cu_guard g;
    DSV4_TRY(dsv4_cu_enter(ex, op, &g));
    void *s = dsv4_cu_stream(ex);
    dsv4_cu_linear l = {
        .fmt = (int)a->fmt, .groups = 1, .m = a->m, .n = a->n, .k = a->k,
        .w = a->w, .ws_r_bytes = a->ws_r * (int64_t)elem_bytes(a->fmt),
        .scale = a->scale, .ss0 = a->ss0, .ss1 = a->ss1, .y = a->y, .y_bf16 = a->y_bf16, .ys_m = a->ys_m,
    };
    dsv4_cu_stage_head *h = head_of(a->workspace);
    int e = a->m ? dsv4_cu_stage_launch(a->x, a->x_bf16, a->xs_m, 0, a->m, 1, a->k, mx32(a->fmt), h, s) : 0;
    use_staging(&l, h, a->m);
    if (e == 0) e = dsv4_cu_linear_launch(&l, s);
    l.w = w3->data, l.scale = s3 ? s3->data : NULL, l.y = y3;
    if (e == 0) e = dsv4_cu_linear_launch(&l, s);
    dsv4_cu_leave(&g);
    return dsv4_cu_status(e, op);
}

dsv4_status dsv4_cu_linear_prestaged(const dsv4_exec *ex, const dsv4_linear_args *a)
{
    const char *op = "linear";
    if (!quantized(a->fmt) || a->groups != 1 || a->bias)
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: a prestaged product takes quantized weights, one group, no bias", op);
    dsv4_cu_guard g;
    DSV4_TRY(dsv4_cu_enter(ex, op, &g));
    dsv4_cu_linear l = {
        .fmt = (int)a->fmt, .groups = 1, .m = a->m, .n = a->n, .k = a->k,
        .w = a->w, .ws_r_bytes = a->ws_r * (int64_t)elem_bytes(a->fmt),
        .scale = a->scale, .ss0 = a->ss0, .ss1 = a->ss1, .y = a->y, .y_bf16 = a->y_bf16, .ys_m = a->ys_m,
    };
    use_staging(&l, head_of(a->workspace), a->m);
    const int e = dsv4_cu_linear_launch(&l, dsv4_cu_stream(ex));
    dsv4_cu_leave(&g);
    return dsv4_cu_status(e, op);
}

const struct dsv4_linear_ops dsv4_cuda_linear_ops = {workspace_size, cu_linear, cu_stage};
