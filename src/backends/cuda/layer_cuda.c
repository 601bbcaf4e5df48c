/* The layer family of the cuda backend (core/ops_layer.h): RMSNorm, the four mHC entries, the
 * router and SwiGLU run on the device (layer_cuda.cu), the MoE block on moe_cuda.cu's grouping
 * and the linear family's kernels, all launched on the context's stream with nothing allocated,
 * read back or waited for. */
#include "backends/cuda/cuda_glue.h"
#include "backends/cuda/cuda_ops.h"
#include "core/error.h"
#include "core/ops_layer.h"

static dsv4_status cu_rms(const dsv4_exec *ex, const dsv4_rms_args *a)
{
    CU_LAUNCH(ex, "rms_norm",
              dsv4_cu_rms_launch(a->x, a->ldx, a->x_bf16, a->w, a->w_bf16, a->y, a->ldy, a->y_bf16, a->rows, a->d,
                                 a->eps, dsv4_cu_stream(ex)));
}

/* The pre part of hc_pre / hc_post_pre / hc_head on the streams `src`. */
static dsv4_status hc_pre_on(const dsv4_exec *ex, const char *op, const dsv4_hc_args *a, const dsv4_hc_streams *src)
{
    if (dsv4_cu_hc_slices(a->D, a->nmix) < 1)
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: D = %lld is too small for the cuda kernel (it needs D >= %d)", op,
                         (long long)a->D, 2 * (a->nmix + 1));
    const dsv4_cu_hc_pre p = {a->T, a->D, a->n, a->nmix, a->fn, a->ldfn, a->scale, a->base, a->iters, a->eps,
                              a->norm_eps, src->data, src->st, src->sj, a->y, a->ldy, a->post_out, a->post_out_t,
                              a->comb_out, a->comb_out_t, a->comb_out_j};
    return dsv4_cu_status(dsv4_cu_hc_pre_launch(&p, dsv4_cu_stream(ex)), op);
}

static dsv4_status hc_run(const dsv4_exec *ex, const char *op, const dsv4_hc_args *a, int post, int pre)
{
    dsv4_cu_guard g;
    DSV4_TRY(dsv4_cu_enter(ex, op, &g));
    dsv4_status s = DSV4_OK;
    if (post)
        s = dsv4_cu_status(dsv4_cu_hc_post_launch(a->T, a->D, a->n, a->x, a->ldx, a->res.data, a->res.st, a->res.sj,
                                                  a->post, a->post_t, a->comb, a->comb_t, a->comb_j, a->out.data,
                                                  a->out.st, a->out.sj, dsv4_cu_stream(ex)),
                           op);
    if (s == DSV4_OK && pre) s = hc_pre_on(ex, op, a, post ? &a->out : &a->in);
    dsv4_cu_leave(&g);
    return s;
}

static dsv4_status cu_hc_pre(const dsv4_exec *ex, const dsv4_hc_args *a) { return hc_run(ex, "hc_pre", a, 0, 1); }
static dsv4_status cu_hc_post(const dsv4_exec *ex, const dsv4_hc_args *a) { return hc_run(ex, "hc_post", a, 1, 0); }
static dsv4_status cu_hc_post_pre(const dsv4_exec *ex, const dsv4_hc_args *a)
{
    return hc_run(ex, "hc_post_pre", a, 1, 1);
}
static dsv4_status cu_hc_head(const dsv4_exec *ex, const dsv4_hc_args *a) { return hc_run(ex, "hc_head", a, 0, 1); }

static dsv4_status cu_swiglu(const dsv4_exec *ex, const dsv4_swiglu_args *a)
{
    CU_LAUNCH(ex, "swiglu",
              dsv4_cu_swiglu_launch(a->g, a->ldg, a->u, a->ldu, a->w, a->h, a->ldh, a->rows, a->n, a->limit,
                                    dsv4_cu_stream(ex)));
}

_Static_assert(DSV4_CU_ROUTE_MAX_EXPERTS == DSV4_ROUTE_MAX_EXPERTS && DSV4_CU_ROUTE_MAX_TOPK == DSV4_ROUTE_MAX_TOPK,
               "the route kernel's shared arrays follow layer.h's bounds");

static dsv4_status cu_route(const dsv4_exec *ex, const dsv4_route_args *a)
{
    const dsv4_cu_route r = {a->x, a->ldx, a->x_bf16, a->w, a->ldw, a->w_bf16, a->bias, a->tid2eid, a->ldtid, a->V,
                             a->tid_i64, a->token_ids, a->tok_stride, a->tok_i64, a->ids, a->ldids, a->weights,
                             a->ldweights, a->T, a->D, a->E, a->topk, a->route_scale};
    CU_LAUNCH(ex, "route", dsv4_cu_route_launch(&r, dsv4_cu_stream(ex)));
}

const struct dsv4_layer_ops dsv4_cuda_layer_ops = {
    .rms_norm = cu_rms,
    .hc_pre = cu_hc_pre,
    .hc_post = cu_hc_post,
    .hc_post_pre = cu_hc_post_pre,
    .hc_head = cu_hc_head,
    .route = cu_route,
    .swiglu = cu_swiglu,
    .moe = dsv4_cu_moe,
};
