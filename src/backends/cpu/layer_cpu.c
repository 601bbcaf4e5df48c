/* The layer family of both cpu backends: the same drivers run with the scalar kernels (cpu-ref)
 * or the best ISA's (cpu). Work is cut into fixed pieces (rows, d-chunks, mix rows, expert
 * chunks) that each thread computes whole, so the result never depends on the thread count. */
#include "backends/cpu/cpu_layer.h"
#include "backends/cpu/cpu_linear.h"
#include "core/error.h"
#include "core/pool.h"
#include "formats/codec.h"

#include <math.h>
#include <string.h>

enum {
    ROW_PAR_MIN = 16384, /* values per call below which row kernels stay on one thread */
    HC_TB = 4,           /* tokens per mHC block (mix dots share each fn row between them) */
    HC_DCHUNK = 1024,    /* d-chunk of the element-wise mHC steps */
    RT_TB = 4,           /* tokens per router block */
    RT_ECHUNK = 8,       /* experts per router work item */
    HC_MAX_MIX = (2 + DSV4_HC_MAX) * DSV4_HC_MAX,
};

const dsv4_cpu_layer_kernels *dsv4_cpu_layer_kernels_best(const dsv4_exec *ex)
{
    switch (ex->isa) {
    case DSV4_ISA_AVX512: return &dsv4_cpu_layer_kernels_avx512;
    case DSV4_ISA_AVX2: return &dsv4_cpu_layer_kernels_avx2;
    default: return &dsv4_cpu_layer_kernels_scalar;
    }
}

static size_t esize(int bf16) { return bf16 ? 2 : 4; }

/* ---- RMSNorm ---------------------------------------------------------------------------- */
/* One call of a row loop below on the pool: its kernels and arguments. */
typedef struct {
    const dsv4_cpu_layer_kernels *kn;
    const void *a; /* the call's argument struct */
} layer_job;

/* A row loop runs on several threads once it touches more than `min` values. */
static int64_t grain_for(int64_t items, int64_t values, int64_t min) { return values > min ? DSV4_PAR_AUTO : items; }

static void rms_rows(void *v, int64_t lo, int64_t hi)
{
    const dsv4_cpu_layer_kernels *kn = ((const layer_job *)v)->kn;
    const dsv4_rms_args *a = ((const layer_job *)v)->a;
    const char *x = a->x;
    char *y = a->y;
    for (int64_t r = lo; r < hi; r++) {
        const char *xr = x + (size_t)(r * a->ldx) * esize(a->x_bf16);
        float ms = kn->sumsq(xr, a->x_bf16, a->d) / (float)a->d;
        float inv = 1.0f / sqrtf(ms + a->eps);
        kn->scale_row(xr, a->x_bf16, a->d, inv, a->w, a->w_bf16, y + (size_t)(r * a->ldy) * esize(a->y_bf16),
                      a->y_bf16);
    }
}

static dsv4_status rms_with(const dsv4_cpu_layer_kernels *kn, const dsv4_exec *ex, const dsv4_rms_args *a)
{
    layer_job j = {kn, a};
    dsv4_par_for(ex, a->rows, grain_for(a->rows, a->rows * a->d, ROW_PAR_MIN), rms_rows, &j);
    return DSV4_OK;
}

/* ---- mHC --------------------------------------------------------------------------------- */
/* hc_post of token t over d-chunk c into a->out. */
static void post_chunk(const dsv4_cpu_layer_kernels *kn, const dsv4_hc_args *a, int64_t t, int64_t c)
{
    int64_t d0 = c * HC_DCHUNK, d1 = d0 + HC_DCHUNK < a->D ? d0 + HC_DCHUNK : a->D;
    kn->hc_post(a->x + t * a->ldx, a->res.data + t * a->res.st, a->res.sj, a->n, a->post + t * a->post_t,
                a->comb + t * a->comb_t, a->comb_j, a->out.data + t * a->out.st, a->out.sj, d0, d1);
}

/* One token block of hc_run. */
typedef struct {
    const dsv4_cpu_layer_kernels *kn;
    const dsv4_hc_args *a;
    const dsv4_hc_streams *src;
    int64_t t0, nch;
    int nt;
    float (*mix)[HC_MAX_MIX + 1];
    float (*pre)[DSV4_HC_MAX];
} hc_job;

/* Items [lo, hi) of `it` = token * nch + d-chunk of hc_post, from token t0 on. */
static void post_items(void *v, int64_t lo, int64_t hi)
{
    const hc_job *j = v;
    for (int64_t it = lo; it < hi; it++) post_chunk(j->kn, j->a, j->t0 + it / j->nch, it % j->nch);
}

/* Dots of the pre part (hc_pre or hc_head) over tokens [t0, t0+nt) of `src`, items [lo, hi):
 * item i < nmix is row i of fn against every token, item nmix the sums of squares, into mix. */
static void pre_dots(void *v, int64_t lo, int64_t hi)
{
    const hc_job *j = v;
    const dsv4_cpu_layer_kernels *kn = j->kn;
    const dsv4_hc_args *a = j->a;
    const dsv4_hc_streams *src = j->src;
    const int64_t t0 = j->t0;
    const int n = a->n, nmix = a->nmix, nt = j->nt;
    const int64_t D = a->D;
    for (int64_t i = lo; i < hi; i++) {
        float acc[HC_TB] = {0};
        for (int j = 0; j < n; j++) {
            const void *xs[HC_TB];
            float part[HC_TB];
            for (int t = 0; t < nt; t++) xs[t] = src->data + (t0 + t) * src->st + j * src->sj;
            if (i < nmix)
                kn->dots(a->fn + i * a->ldfn + j * D, 0, xs, 1, nt, D, part);
            else
                for (int t = 0; t < nt; t++) part[t] = kn->sumsq(xs[t], 1, D);
            for (int t = 0; t < nt; t++) acc[t] += part[t];
        }
        for (int t = 0; t < nt; t++) j->mix[t][i] = acc[t];
    }
}

/* Items [lo, hi) (token * nch + d-chunk) of the weighted sum of the block. */
static void wsum_items(void *v, int64_t lo, int64_t hi)
{
    const hc_job *j = v;
    const dsv4_hc_args *a = j->a;
    const int64_t D = a->D;
    for (int64_t it = lo; it < hi; it++) {
        int64_t t = it / j->nch, d0 = (it % j->nch) * HC_DCHUNK, d1 = d0 + HC_DCHUNK < D ? d0 + HC_DCHUNK : D;
        j->kn->hc_wsum(j->src->data + (j->t0 + t) * j->src->st, j->src->sj, a->n, j->pre[t], a->y + (j->t0 + t) * a->ldy,
                       d0, d1);
    }
}

/* From the dots of token t0 + t: pre, and for hc_pre post/comb into the outputs. */
static void pre_split(const dsv4_hc_args *a, int64_t tt, const float *mix, float *pre)
{
    const int n = a->n, nmix = a->nmix;
    float r = 1.0f / sqrtf(mix[nmix] / (float)(n * a->D) + a->norm_eps), m[HC_MAX_MIX];
    for (int i = 0; i < nmix; i++) m[i] = mix[i] * r;
    float post[DSV4_HC_MAX], comb[DSV4_HC_MAX * DSV4_HC_MAX];
    dsv4_hc_split(m, n, nmix, a->scale, a->base, a->iters, a->eps, pre, post, comb);
    if (nmix == n) return;
    for (int j = 0; j < n; j++) {
        a->post_out[tt * a->post_out_t + j] = post[j];
        for (int k = 0; k < n; k++) a->comb_out[tt * a->comb_out_t + j * a->comb_out_j + k] = comb[j * n + k];
    }
}

/* Token blocks of HC_TB: the (post and) dots on the pool, the split (a few hundred flops per
 * token) on the calling thread, and the weighted sum on the pool only when it is large enough to
 * pay for waking the workers. */
static dsv4_status hc_run(const dsv4_cpu_layer_kernels *kn, const dsv4_exec *ex, const dsv4_hc_args *a, int do_post,
                          int do_pre)
{
    const int64_t D = a->D, nch = (D + HC_DCHUNK - 1) / HC_DCHUNK;
    hc_job j = {kn, a, do_post ? &a->out : &a->in, 0, nch, 0, NULL, NULL};
    if (!do_pre) {
        dsv4_par_for(ex, a->T * nch, grain_for(a->T * nch, a->T * D * a->n, ROW_PAR_MIN), post_items, &j);
        return DSV4_OK;
    }
    for (int64_t t0 = 0; t0 < a->T; t0 += HC_TB) {
        int nt = a->T - t0 < HC_TB ? (int)(a->T - t0) : HC_TB;
        float mix[HC_TB][HC_MAX_MIX + 1], pre[HC_TB][DSV4_HC_MAX];
        j.t0 = t0;
        j.nt = nt;
        j.mix = mix;
        j.pre = pre;
        const int par = nt * a->n * D * (a->nmix + 1) > ROW_PAR_MIN;
        /* the dots of hc_pre read the streams hc_post writes: the first loop ends before the second */
        if (do_post) dsv4_par_for(ex, nt * nch, par ? DSV4_PAR_AUTO : nt * nch, post_items, &j);
        dsv4_par_for(ex, a->nmix + 1, par ? DSV4_PAR_AUTO : a->nmix + 1, pre_dots, &j);
        for (int t = 0; t < nt; t++) pre_split(a, t0 + t, mix[t], pre[t]);
        dsv4_par_for(ex, nt * nch, grain_for(nt * nch, nt * a->n * D, 4 * ROW_PAR_MIN), wsum_items, &j);
    }
    return DSV4_OK;
}

/* ---- router ------------------------------------------------------------------------------ */
static int64_t load_index(const void *p, int i64, int64_t i)
{
    return i64 ? ((const int64_t *)p)[i] : ((const int32_t *)p)[i];
}

static const void *row_at(const void *p, int bf16, int64_t i, int64_t ld)
{
    return (const char *)p + (size_t)(i * ld) * esize(bf16);
}

/* Hash layers: experts from the table, weights from the dots of the chosen experts only. */
static void hash_pairs(void *v, int64_t lo, int64_t hi)
{
    const dsv4_cpu_layer_kernels *kn = ((const layer_job *)v)->kn;
    const dsv4_route_args *a = ((const layer_job *)v)->a;
    const int k = a->topk;
    for (int64_t p = lo; p < hi; p++) {
        int64_t t = p / k, s = p % k, tok = load_index(a->token_ids, a->tok_i64, t * a->tok_stride);
        int32_t e = (int32_t)load_index(a->tid2eid, a->tid_i64, tok * a->ldtid + s);
        const void *xt = row_at(a->x, a->x_bf16, t, a->ldx);
        float logit;
        kn->dots(row_at(a->w, a->w_bf16, e, a->ldw), a->w_bf16, &xt, a->x_bf16, 1, a->D, &logit);
        a->ids[t * a->ldids + s] = e;
        a->weights[t * a->ldweights + s] = dsv4_router_score(logit);
    }
}

static void route_hash(const dsv4_cpu_layer_kernels *kn, const dsv4_exec *ex, const dsv4_route_args *a)
{
    const int k = a->topk;
    layer_job j = {kn, a};
    dsv4_par_for(ex, a->T * k, grain_for(a->T * k, a->T * k * a->D, ROW_PAR_MIN), hash_pairs, &j);
    for (int64_t t = 0; t < a->T; t++) dsv4_route_normalize(a->weights + t * a->ldweights, k, a->route_scale);
}

/* The gate of one token block of route_with. */
typedef struct {
    const dsv4_cpu_layer_kernels *kn;
    const dsv4_route_args *a;
    const void *const *xs;
    int nt;
    float (*score)[DSV4_ROUTE_MAX_EXPERTS];
} gate_job;

/* Expert chunks [lo, hi) of RT_ECHUNK experts: their scores for every token of the block. */
static void gate_chunks(void *v, int64_t lo, int64_t hi)
{
    const gate_job *j = v;
    const dsv4_route_args *a = j->a;
    for (int64_t c = lo; c < hi; c++)
        for (int64_t e = c * RT_ECHUNK; e < a->E && e < (c + 1) * RT_ECHUNK; e++) {
            float logit[RT_TB];
            j->kn->dots(row_at(a->w, a->w_bf16, e, a->ldw), a->w_bf16, j->xs, a->x_bf16, j->nt, a->D, logit);
            for (int t = 0; t < j->nt; t++) j->score[t][e] = dsv4_router_score(logit[t]);
        }
}

static dsv4_status route_with(const dsv4_cpu_layer_kernels *kn, const dsv4_exec *ex, const dsv4_route_args *a)
{
    if (a->tid2eid) {
        route_hash(kn, ex, a);
        return DSV4_OK;
    }
    const int E = a->E, nchunk = (E + RT_ECHUNK - 1) / RT_ECHUNK;
    _Static_assert(RT_TB <= DSV4_DOTS_MAX_ROWS && HC_TB <= DSV4_DOTS_MAX_ROWS, "block exceeds the dots kernel");
    for (int64_t t0 = 0; t0 < a->T; t0 += RT_TB) {
        int nt = a->T - t0 < RT_TB ? (int)(a->T - t0) : RT_TB;
        float score[RT_TB][DSV4_ROUTE_MAX_EXPERTS];
        const void *xs[RT_TB];
        for (int t = 0; t < nt; t++) xs[t] = row_at(a->x, a->x_bf16, t0 + t, a->ldx);
        gate_job j = {kn, a, xs, nt, score};
        dsv4_par_for(ex, nchunk, grain_for(nchunk, nt * E * a->D, ROW_PAR_MIN), gate_chunks, &j);
        for (int t = 0; t < nt; t++) { /* E * topk compares per token: not worth a second loop */
            int32_t *ids = a->ids + (t0 + t) * a->ldids;
            float *w = a->weights + (t0 + t) * a->ldweights;
            dsv4_route_select(score[t], a->bias, E, a->topk, ids);
            for (int s = 0; s < a->topk; s++) w[s] = score[t][ids[s]];
            dsv4_route_normalize(w, a->topk, a->route_scale);
        }
    }
    return DSV4_OK;
}

/* ---- SwiGLU ------------------------------------------------------------------------------- */
static void swiglu_rows(void *v, int64_t lo, int64_t hi)
{
    const dsv4_cpu_layer_kernels *kn = ((const layer_job *)v)->kn;
    const dsv4_swiglu_args *a = ((const layer_job *)v)->a;
    for (int64_t r = lo; r < hi; r++)
        kn->swiglu_row(a->g + r * a->ldg, a->u + r * a->ldu, a->n, a->limit, a->w ? a->w[r] : 1.0f, a->h + r * a->ldh);
}

static dsv4_status swiglu_with(const dsv4_cpu_layer_kernels *kn, const dsv4_exec *ex, const dsv4_swiglu_args *a)
{
    layer_job j = {kn, a};
    dsv4_par_for(ex, a->rows, grain_for(a->rows, a->rows * a->n, ROW_PAR_MIN), swiglu_rows, &j);
    return DSV4_OK;
}

/* ---- MoE block ----------------------------------------------------------------------------- */
/* Counting sort of the pairs by expert (stable: pairs of one expert stay in p order), after
 * checking every id. O(T*k + E), one pass each way; cheap next to one expert product, so it stays
 * on one thread. */
static dsv4_status moe_group(const dsv4_moe_args *a)
{
    int32_t *off = a->offsets;
    for (int e = 0; e <= a->E; e++) off[e] = 0;
    for (int64_t t = 0; t < a->T; t++)
        for (int s = 0; s < a->k; s++) {
            int32_t e = a->ids[t * a->ldids + s];
            if (e < 0 || e >= a->E)
                return dsv4_fail(DSV4_ERR_RANGE, "moe: ids[%lld][%d] = %d is not an expert in [0, %d)", (long long)t, s,
                                 e, a->E);
            off[e + 1]++;
        }
    for (int e = 0; e < a->E; e++) off[e + 1] += off[e];
    /* off[e] is now the next free row of expert e; restore the starts afterwards */
    for (int64_t t = 0; t < a->T; t++)
        for (int s = 0; s < a->k; s++) {
            int32_t e = a->ids[t * a->ldids + s], i = off[e]++;
            int32_t p = (int32_t)(t * a->k + s);
            a->order[i] = p;
            a->pos[p] = i;
            a->wsorted[i] = a->weights[t * a->ldweights + s];
        }
    for (int e = a->E; e > 0; e--) off[e] = off[e - 1];
    off[0] = 0;
    return DSV4_OK;
}

/* xg[i] = x[order[i] / k] for the R sorted rows. */
static void gather_rows(void *v, int64_t lo, int64_t hi)
{
    const dsv4_moe_args *a = v;
    for (int64_t i = lo; i < hi; i++) memcpy(a->xg + i * a->D, a->x + (a->order[i] / a->k) * a->ldx, (size_t)a->D * 2);
}

/* the sorted rows of the experts run (all R rows when they are all run) */
static void moe_gather(const dsv4_exec *ex, const dsv4_moe_args *a)
{
    const int64_t r0 = a->offsets[a->e_lo], n = a->offsets[a->e_lo + a->e_n] - r0;
    dsv4_moe_args b = *a;
    b.order = a->order + r0;
    b.xg = a->xg + r0 * a->D;
    dsv4_par_for(ex, n, grain_for(n, n * a->D, ROW_PAR_MIN), gather_rows, &b);
}

static void combine_items(void *v, int64_t lo, int64_t hi)
{
    const dsv4_cpu_layer_kernels *kn = ((const layer_job *)v)->kn;
    const dsv4_moe_args *a = ((const layer_job *)v)->a;
    const int64_t nch = (a->D + HC_DCHUNK - 1) / HC_DCHUNK;
    const uint16_t *shared = a->shared ? a->sout : NULL;
    for (int64_t it = lo; it < hi; it++) {
        int64_t t = it / nch, d0 = (it % nch) * HC_DCHUNK, d1 = d0 + HC_DCHUNK < a->D ? d0 + HC_DCHUNK : a->D;
        const int32_t *ids = a->ids + t * a->ldids;
        int slot[DSV4_ROUTE_MAX_TOPK];
        for (int s = 0; s < a->k; s++) { /* insertion sort of the slots by (expert, slot) */
            int q = s;
            while (q > 0 && ids[slot[q - 1]] > ids[s]) {
                slot[q] = slot[q - 1];
                q--;
            }
            slot[q] = s;
        }
        const uint16_t *rows[DSV4_ROUTE_MAX_TOPK];
        int n = 0;
        for (int s = 0; s < a->k; s++)
            if (ids[slot[s]] >= a->e_lo && ids[slot[s]] < a->e_lo + a->e_n)
                rows[n++] = a->out + (int64_t)a->pos[t * a->k + slot[s]] * a->D;
        const uint16_t *sh = shared ? shared + t * a->D : NULL;
        if (!a->yf) {
            kn->sum_rows(rows, n, sh, a->y + t * a->ldy, d0, d1);
            continue;
        }
        /* unrounded (dsv4_moe_partial): the kernels' order, the same loop on every ISA */
        float *yf = a->yf + t * a->ldyf;
        for (int64_t d = d0; d < d1; d++) {
            float v = 0.0f;
            for (int r = 0; r < n; r++) v += dsv4_bf16_to_f32(rows[r][d]);
            if (sh) v += dsv4_bf16_to_f32(sh[d]);
            yf[d] = v;
        }
    }
}

static void moe_combine(const dsv4_cpu_layer_kernels *kn, const dsv4_exec *ex, const dsv4_moe_args *a)
{
    const int64_t nch = (a->D + HC_DCHUNK - 1) / HC_DCHUNK;
    layer_job j = {kn, a};
    dsv4_par_for(ex, a->T * nch, grain_for(a->T * nch, a->T * a->D * a->k, ROW_PAR_MIN), combine_items, &j);
}

/* y [m, n] (contiguous BF16) = x [m, k] (BF16, row stride ldx) times the weight w (scale s) in
 * `fmt`; staged: the linear work space holds the staging of x (quantized formats). */
static dsv4_status moe_product(const struct dsv4_linear_ops *lin, const dsv4_exec *ex, const dsv4_moe_args *a,
                               dsv4_linear_format fmt, const dsv4_tensor *w, const dsv4_tensor *s, const uint16_t *x,
                               int64_t ldx, int64_t m, int64_t k, uint16_t *y, int64_t n, int staged)
{
    const dsv4_linear_args la = {
        .fmt = fmt, .groups = 1, .m = m, .n = n, .k = k, .x = x, .x_bf16 = 1, .xs_m = ldx,
        .w = w->data, .ws_r = w->stride[0], .scale = s ? s->data : NULL, .ss0 = s ? s->stride[0] : 0,
        .ss1 = s ? s->stride[1] : 0, .y = y, .y_bf16 = 1, .ys_m = n,
        .workspace = a->lin, .workspace_bytes = a->lin_bytes, .staged = staged,
    };
    return lin->linear(ex, &la);
}

/* One expert on m rows x (row stride ldx) of width D: x staged once (quantized formats), g = w1·x
 * and u = w3·x from that staging, h = swiglu(g, u)·rw in place of g, out = w2·h. */
static dsv4_status moe_ffn(const dsv4_cpu_layer_kernels *kn, const struct dsv4_linear_ops *lin, const dsv4_exec *ex,
                           const dsv4_moe_args *a, const dsv4_ffn_weights *f, int64_t I, const uint16_t *x,
                           int64_t ldx, int64_t m, const float *rw, uint16_t *g, uint16_t *u, uint16_t *out)
{
    const int staged = f->fmt <= DSV4_LINEAR_FP4;
    if (staged) {
        const dsv4_linear_args sa = {.fmt = f->fmt, .groups = 1, .m = m, .k = a->D, .x = x, .x_bf16 = 1, .xs_m = ldx,
                                     .workspace = a->lin, .workspace_bytes = a->lin_bytes};
        DSV4_TRY(lin->stage(ex, &sa));
    }
    DSV4_TRY(moe_product(lin, ex, a, f->fmt, f->w1, f->w1_scale, x, ldx, m, a->D, g, I, staged));
    DSV4_TRY(moe_product(lin, ex, a, f->fmt, f->w3, f->w3_scale, x, ldx, m, a->D, u, I, staged));
    const dsv4_swiglu_args sw = {g, I, u, I, rw, g, I, m, I, a->limit};
    DSV4_TRY(swiglu_with(kn, ex, &sw));
    return moe_product(lin, ex, a, f->fmt, f->w2, f->w2_scale, g, I, m, I, out, a->D, 0);
}

static dsv4_status moe_with(const dsv4_cpu_layer_kernels *kn, const struct dsv4_linear_ops *lin, const dsv4_exec *ex,
                            const dsv4_moe_args *a)
{
    DSV4_TRY(moe_group(a));
    moe_gather(ex, a);
    /* each expert: one product over all of its rows (one gather and one staging shared by w1 and w3) */
    for (int e = a->e_lo; e < a->e_lo + a->e_n; e++) {
        const int64_t r0 = a->offsets[e], n = a->offsets[e + 1] - r0;
        if (!n) continue;
        DSV4_TRY(moe_ffn(kn, lin, ex, a, &a->experts[e - a->e_lo], a->I, a->xg + r0 * a->D, a->D, n, a->wsorted + r0,
                         a->g + r0 * a->I, a->u + r0 * a->I, a->out + r0 * a->D));
    }
    if (a->shared) DSV4_TRY(moe_ffn(kn, lin, ex, a, a->shared, a->Is, a->x, a->ldx, a->T, NULL, a->sg, a->su, a->sout));
    moe_combine(kn, ex, a);
    return DSV4_OK;
}

/* Two tables over the same drivers: the kernel set is the only difference. */
#define DEFINE_LAYER_OPS(prefix, kernels_expr)                                                                   \
    static dsv4_status prefix##_rms(const dsv4_exec *ex, const dsv4_rms_args *a)                                 \
    { return rms_with(kernels_expr, ex, a); }                                                                    \
    static dsv4_status prefix##_hc_pre(const dsv4_exec *ex, const dsv4_hc_args *a)                              \
    { return hc_run(kernels_expr, ex, a, 0, 1); }                                                                \
    static dsv4_status prefix##_hc_post(const dsv4_exec *ex, const dsv4_hc_args *a)                             \
    { return hc_run(kernels_expr, ex, a, 1, 0); }                                                                \
    static dsv4_status prefix##_hc_post_pre(const dsv4_exec *ex, const dsv4_hc_args *a)                         \
    { return hc_run(kernels_expr, ex, a, 1, 1); }                                                                \
    static dsv4_status prefix##_route(const dsv4_exec *ex, const dsv4_route_args *a)                            \
    { return route_with(kernels_expr, ex, a); }                                                                  \
    static dsv4_status prefix##_swiglu(const dsv4_exec *ex, const dsv4_swiglu_args *a)                          \
    { return swiglu_with(kernels_expr, ex, a); }                                                                 \
    static dsv4_status prefix##_moe(const dsv4_exec *ex, const dsv4_moe_args *a)                                \
    { return moe_with(kernels_expr, &prefix##_linear_ops, ex, a); }                                              \
    const struct dsv4_layer_ops prefix##_layer_ops = {                                                           \
        .rms_norm = prefix##_rms,                                                                                \
        .hc_pre = prefix##_hc_pre,                                                                               \
        .hc_post = prefix##_hc_post,                                                                             \
        .hc_post_pre = prefix##_hc_post_pre,                                                                     \
        .hc_head = prefix##_hc_pre,                                                                              \
        .route = prefix##_route,                                                                                 \
        .swiglu = prefix##_swiglu,                                                                               \
        .moe = prefix##_moe,                                                                                     \
        .moe_partial = prefix##_moe,                                                                             \
    };

DEFINE_LAYER_OPS(dsv4_cpu_ref, &dsv4_cpu_layer_kernels_scalar)
DEFINE_LAYER_OPS(dsv4_cpu, dsv4_cpu_layer_kernels_best(ex))
