/* The MoE block of the cuda backend (core/ops_layer.h dsv4_moe_args), every step on the device
 * and on the context's stream, so it never waits and can be captured in a graph: the grouping of
 * the pairs by expert, the gather of their rows, one product per weight over every expert's rows
 * (the expert row ranges are read by the kernels, linear_cuda.c dsv4_cu_moe_product), SwiGLU with
 * the clamp and the routing weight, the shared expert on the linear family's plain products, and
 * the combine (moe_cuda.cu). The host never reads the ids: a pair with an id outside [0, E) is
 * dropped on the device instead of reported (include/dsv4/layer.h). */
#include "backends/cuda/cuda_glue.h"
#include "backends/cuda/cuda_ops.h"
#include "core/error.h"
#include "core/ops_layer.h"
#include "core/ops_linear.h"

#include <stdlib.h>

/* y [m, n] (BF16) = x [m, k] (BF16, row stride ldx) times w (scale s) in fmt; with gate_up (the
 * shared expert, w = its w1) also su = x times its w3, on the same staging. */
static dsv4_status shared_product(const dsv4_exec *ex, const dsv4_moe_args *a, dsv4_linear_format fmt,
                                  const dsv4_tensor *w, const dsv4_tensor *s, const uint16_t *x, int64_t ldx,
                                  int64_t k, uint16_t *y, int64_t n, const dsv4_ffn_weights *gate_up)
{
    const dsv4_linear_args la = {
        .fmt = fmt, .groups = 1, .m = a->T, .n = n, .k = k, .x = x, .x_bf16 = 1, .xs_m = ldx,
        .w = w->data, .ws_r = w->stride[0], .scale = s ? s->data : NULL, .ss0 = s ? s->stride[0] : 0,
        .ss1 = s ? s->stride[1] : 0, .y = y, .y_bf16 = 1, .ys_m = n,
        .workspace = a->lin, .workspace_bytes = a->lin_bytes,
    };
    return gate_up ? dsv4_cu_linear_pair(ex, &la, gate_up->w3, gate_up->w3_scale, a->su)
                   : dsv4_cuda_linear_ops.linear(ex, &la);
}

static int quantized(dsv4_linear_format fmt) { return fmt <= DSV4_LINEAR_FP4; }

/* 1 (default): for quantized weights the gather and each SwiGLU run inside the staging that
 * follows them (cuda_ops.h dsv4_cu_stage_gather_launch, _swiglu_launch), three launches fewer,
 * and the combine splits a token over several CTAs, the same bits; $DSV4_CUDA_MOE_FUSE = 0 keeps
 * the separate kernels and one combine CTA a token (the A/B of
 * BENCHMARKS.md "Linear layers on the GPU"). Read once. */
static int moe_fuse(void)
{
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("DSV4_CUDA_MOE_FUSE");
        on = v && *v ? atoi(v) != 0 : 1;
    }
    return on;
}

static dsv4_status moe_run(const dsv4_exec *ex, const dsv4_moe_args *a)
{
    const char *op = "moe";
    void *s = dsv4_cu_stream(ex);
    const int64_t R = a->T * a->k;
    if (a->E > DSV4_CU_MOE_MAX_EXPERTS)
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: the cuda backend groups at most %d experts (got %d)", op,
                         DSV4_CU_MOE_MAX_EXPERTS, a->E);
    DSV4_TRY(dsv4_cu_status(dsv4_cu_moe_group_launch(a->ids, a->ldids, a->weights, a->ldweights, a->T, a->k, a->E,
                                                     a->offsets, a->order, a->pos, a->wsorted, s),
                            op));
    const dsv4_linear_format rf = a->experts[0].fmt;
    const int fuse = moe_fuse() && quantized(rf), mx = rf == DSV4_LINEAR_MXFP8;
    /* every expert's rows at once: g = w1·xg and u = w3·xg in one launch, h = swiglu(g, u)·w, out = w2·h */
    if (fuse)
        DSV4_TRY(dsv4_cu_status(dsv4_cu_stage_gather_launch(a->x, a->ldx, a->order, a->k, R, a->D, mx, a->lin, s), op));
    else
        DSV4_TRY(dsv4_cu_status(dsv4_cu_moe_gather_launch(a->x, a->ldx, a->order, a->k, R, a->D, a->xg, s), op));
    DSV4_TRY(dsv4_cu_moe_product(ex, a->experts, a->E, 0, a->offsets, a->xg, R, a->D, a->g, a->u, a->I, a->lin, !fuse));
    if (fuse)
        DSV4_TRY(dsv4_cu_status(
            dsv4_cu_stage_swiglu_launch(a->g, a->I, a->u, a->I, a->wsorted, a->limit, R, a->I, mx, a->lin, s), op));
    else
        DSV4_TRY(dsv4_cu_status(
            dsv4_cu_swiglu_launch(a->g, a->I, a->u, a->I, a->wsorted, a->g, a->I, R, a->I, a->limit, s), op));
    DSV4_TRY(dsv4_cu_moe_product(ex, a->experts, a->E, 2, a->offsets, a->g, R, a->I, a->out, NULL, a->D, a->lin, !fuse));
    if (a->shared) {
        const dsv4_ffn_weights *f = a->shared;
        DSV4_TRY(shared_product(ex, a, f->fmt, f->w1, f->w1_scale, a->x, a->ldx, a->D, a->sg, a->Is, f));
        if (moe_fuse() && quantized(f->fmt) && a->T) {
            DSV4_TRY(dsv4_cu_status(dsv4_cu_stage_swiglu_launch(a->sg, a->Is, a->su, a->Is, NULL, a->limit, a->T, a->Is,
                                                                f->fmt == DSV4_LINEAR_MXFP8, a->lin, s),
                                    op));
            const dsv4_linear_args la = {
                .fmt = f->fmt, .groups = 1, .m = a->T, .n = a->D, .k = a->Is, .x = a->sg, .x_bf16 = 1,
                .xs_m = a->Is, .w = f->w2->data, .ws_r = f->w2->stride[0], .scale = f->w2_scale->data,
                .ss0 = f->w2_scale->stride[0], .ss1 = f->w2_scale->stride[1], .y = a->sout, .y_bf16 = 1,
                .ys_m = a->D, .workspace = a->lin, .workspace_bytes = a->lin_bytes,
            };
            DSV4_TRY(dsv4_cu_linear_prestaged(ex, &la));
        } else {
            DSV4_TRY(dsv4_cu_status(
                dsv4_cu_swiglu_launch(a->sg, a->Is, a->su, a->Is, NULL, a->sg, a->Is, a->T, a->Is, a->limit, s), op));
            DSV4_TRY(shared_product(ex, a, f->fmt, f->w2, f->w2_scale, a->sg, a->Is, a->Is, a->sout, a->D, NULL));
        }
    }
    return dsv4_cu_status(dsv4_cu_moe_combine_launch(a->ids, a->ldids, a->pos, a->k, a->E, a->out,
                                                     a->shared ? a->sout : NULL, a->T, a->D, a->y, a->ldy, moe_fuse(), s),
                          op);
}

dsv4_status dsv4_cu_moe(const dsv4_exec *ex, const dsv4_moe_args *a)
{
    dsv4_cu_guard g;
    DSV4_TRY(dsv4_cu_enter(ex, "moe", &g));
    dsv4_status st = moe_run(ex, a);
    dsv4_cu_leave(&g);
    return st;
}
